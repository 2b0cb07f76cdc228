{{/*
Render-time checks of value combinations. Each failure says which value is wrong and what to
change; the chart tests (tests/chart) render every case and match these messages.
*/}}

{{/* (dict "name" "injector.logFormat" "value" x "allowed" (list ...)) */}}
{{- define "rdma-streams.validate.oneOf" -}}
{{- if not (has .value .allowed) -}}
{{- fail (printf "%s must be one of %s; got %q" .name (join ", " .allowed) (toString .value)) -}}
{{- end -}}
{{- end -}}

{{/* (dict "name" "shim.hostPath.root" "value" "/opt/x"): absolute and normalised. */}}
{{- define "rdma-streams.validate.absPath" -}}
{{- if not (regexMatch "^(/[A-Za-z0-9._+@-]+)+$" (toString .value)) -}}
{{- fail (printf "%s must be an absolute, normalised path (no trailing /, no //, only letters, digits and ._+@-); got %q" .name (toString .value)) -}}
{{- end -}}
{{- if regexMatch "(^|/)\\.\\.?(/|$)" .value -}}
{{- fail (printf "%s must not contain . or .. components; got %q" .name .value) -}}
{{- end -}}
{{- end -}}

{{/* Is .path equal to or below .root (component-wise)? Prints "true" or nothing. */}}
{{- define "rdma-streams.pathUnder" -}}
{{- if or (eq .path .root) (hasPrefix (printf "%s/" .root) .path) -}}true{{- end -}}
{{- end -}}

{{/*
(dict "namespace" ns "name" x "secret" (lookup ...)): the admin's peer keys Secret holds a keys
file the gateways accept: data key `keys`, one standard base64 key of at least 32 bytes per
line, whole-line `#` comments and blank lines ignored, at least one key. Checked only where
Helm can look the Secret up (install and upgrade, not `helm template`); a missing Secret is
not an error here: the gateway pods wait for it (the volume cannot be mounted).
*/}}
{{- define "rdma-streams.validate.peerKeys" -}}
{{- if .secret -}}
{{- $where := printf "gateway.peerAuth.existingSecret: Secret %s/%s" .namespace .name -}}
{{- if not (and .secret.data (hasKey .secret.data "keys")) -}}
{{- fail (printf "%s has no data key \"keys\" (the gateways' keys file: one base64 key per line)" $where) -}}
{{- end -}}
{{- $count := 0 -}}
{{- range $i, $line := splitList "\n" (b64dec (index .secret.data "keys")) -}}
{{- $key := trim $line -}}
{{- if and $key (not (hasPrefix "#" $key)) -}}
{{- if or (not (regexMatch "^[A-Za-z0-9+/]+={0,2}$" $key)) (ne (mod (len $key) 4) 0) -}}
{{- fail (printf "%s: line %d of keys is not a standard base64 key (one key per line, whole-line # comments)" $where (add1 $i)) -}}
{{- end -}}
{{- $bytes := sub (mul (div (len $key) 4) 3) (sub (len $key) (len (trimSuffix "=" (trimSuffix "=" $key)))) -}}
{{- if lt $bytes 32 -}}
{{- fail (printf "%s: line %d of keys holds %d bytes; a key needs at least 32 random bytes (head -c 32 /dev/urandom | base64)" $where (add1 $i) $bytes) -}}
{{- end -}}
{{- $count = add1 $count -}}
{{- end -}}
{{- end -}}
{{- if eq $count 0 -}}
{{- fail (printf "%s holds no key in keys (one base64 key per line; the first signs)" $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rdma-streams.validate" -}}
{{- $v := .Values -}}

{{- if has .Release.Namespace (list "kube-system" "kube-public" "kube-node-lease") -}}
{{- fail (printf "install rdma-streams into a namespace of its own, not %q: the webhook never selects its own namespace, and system namespaces must not depend on it (for example --namespace rdma-streams --create-namespace)" .Release.Namespace) -}}
{{- end -}}

{{/* device plugin */}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "devicePlugin.registration" "value" $v.devicePlugin.registration "allowed" (list "kubelet-sock" "plugin-watcher")) -}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "devicePlugin.logFormat" "value" $v.devicePlugin.logFormat "allowed" (list "text" "json")) -}}
{{- include "rdma-streams.validate.absPath" (dict "name" "devicePlugin.kubeletRootDir" "value" $v.devicePlugin.kubeletRootDir) -}}
{{- include "rdma-streams.validate.absPath" (dict "name" "devicePlugin.cdi.dir" "value" $v.devicePlugin.cdi.dir) -}}
{{- if not $v.devicePlugin.pools -}}
{{- fail "devicePlugin.pools must name at least one pool (resourceName, slotsPerHca, selectors); the injected resource defaults to the first" -}}
{{- end -}}
{{- range $i, $pool := $v.devicePlugin.pools -}}
{{- if not $pool.resourceName -}}
{{- fail (printf "devicePlugin.pools[%d] has no resourceName (for example rdma-streams.io/hca)" $i) -}}
{{- end -}}
{{- end -}}

{{/* injector */}}
{{- if lt (int $v.injector.replicas) 1 -}}
{{- fail (printf "injector.replicas must be at least 1 (2 or more recommended: with failurePolicy Fail, opted-in pods cannot start while no injector is ready); got %v" $v.injector.replicas) -}}
{{- end -}}
{{- if and $v.injector.podDisruptionBudget.enabled (lt (int $v.injector.podDisruptionBudget.maxUnavailable) 1) -}}
{{- fail "injector.podDisruptionBudget.maxUnavailable must be at least 1: 0 blocks every node drain" -}}
{{- end -}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "injector.antiAffinity" "value" $v.injector.antiAffinity "allowed" (list "soft" "hard" "none")) -}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "injector.logFormat" "value" $v.injector.logFormat "allowed" (list "text" "json")) -}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "injector.certs.mode" "value" $v.injector.certs.mode "allowed" (list "helm" "cert-manager" "injector")) -}}
{{- if and (eq $v.injector.certs.mode "cert-manager") (not $v.certManager.enabled) -}}
{{- fail "injector.certs.mode=cert-manager needs cert-manager in the cluster: install it and set certManager.enabled=true, or use injector.certs.mode=helm or injector" -}}
{{- end -}}
{{- if and (eq $v.injector.certs.mode "injector") (not $v.injector.clusterAccess) -}}
{{- fail "injector.certs.mode=injector (the injector's --cert-mode self-managed) needs injector.clusterAccess=true: it creates its CA Secret and patches the caBundle through the API server" -}}
{{- end -}}
{{- if lt (int $v.injector.certs.validityDays) 30 -}}
{{- fail (printf "injector.certs.validityDays must be at least 30; got %v" $v.injector.certs.validityDays) -}}
{{- end -}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "injector.profile.podSecurity" "value" $v.injector.profile.podSecurity "allowed" (list "deny" "degrade")) -}}
{{- if lt (int $v.injector.profile.resource.count) 1 -}}
{{- fail "injector.profile.resource.count must be at least 1" -}}
{{- end -}}
{{- if hasKey $v.injector.extraProfiles $v.injector.profile.name -}}
{{- fail (printf "injector.extraProfiles must not redefine %q, the profile the chart renders (injector.profile.name)" $v.injector.profile.name) -}}
{{- end -}}
{{- if not (or (eq $v.injector.defaultProfile $v.injector.profile.name) (hasKey $v.injector.extraProfiles $v.injector.defaultProfile)) -}}
{{- fail (printf "injector.defaultProfile %q is neither injector.profile.name (%q) nor a key of injector.extraProfiles" $v.injector.defaultProfile $v.injector.profile.name) -}}
{{- end -}}

{{/* webhook */}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "webhook.failurePolicy" "value" $v.webhook.failurePolicy "allowed" (list "Fail" "Ignore")) -}}
{{- $timeout := int $v.webhook.timeoutSeconds -}}
{{- if or (lt $timeout 1) (gt $timeout 30) -}}
{{- fail (printf "webhook.timeoutSeconds must be between 1 and 30; got %v" $v.webhook.timeoutSeconds) -}}
{{- end -}}
{{- if ge (int $v.injector.requestTimeoutMs) (mul $timeout 1000) -}}
{{- fail (printf "injector.requestTimeoutMs (%v) must be below webhook.timeoutSeconds (%d s), so a slow review is answered with a clear denial before the API server gives up" $v.injector.requestTimeoutMs $timeout) -}}
{{- end -}}
{{- if lt (mul (int $v.injector.terminationGracePeriodSeconds) 1000) (add (int $v.injector.shutdownDelayMs) 15000) -}}
{{- fail (printf "injector.terminationGracePeriodSeconds (%v) must cover injector.shutdownDelayMs (%v ms) plus the 15 s drain" $v.injector.terminationGracePeriodSeconds $v.injector.shutdownDelayMs) -}}
{{- end -}}
{{- range $v.webhook.excludeNamespaces -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) -}}
{{- fail (printf "webhook.excludeNamespaces: %q is not a namespace name" .) -}}
{{- end -}}
{{- end -}}

{{/* shim delivery */}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "shim.delivery" "value" $v.shim.delivery "allowed" (list "init-copy" "image-volume" "host-path")) -}}
{{- include "rdma-streams.validate.absPath" (dict "name" "shim.mountPath" "value" $v.shim.mountPath) -}}
{{- if hasKey $v.shim.env "LD_PRELOAD" -}}
{{- fail "shim.env must not set LD_PRELOAD: the injector manages it (it appends <mountPath>/<library> to the container's own value)" -}}
{{- end -}}
{{- if and (eq $v.shim.delivery "image-volume") (semverCompare "<1.33.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "shim.delivery=image-volume needs Kubernetes 1.33 or newer with the ImageVolume feature gate (on by default from 1.35); this cluster is %s: use shim.delivery=init-copy" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- $denied := list "/proc" "/sys" "/dev" "/etc" "/boot" "/root" "/run" "/var/run" "/var/lib/kubelet" "/var/lib/containerd" "/var/lib/docker" "/usr/bin" "/usr/sbin" "/usr/lib" "/bin" "/sbin" "/lib" "/lib64" -}}
{{- range $v.shim.hostPath.allowedRoots -}}
{{- include "rdma-streams.validate.absPath" (dict "name" "shim.hostPath.allowedRoots[]" "value" .) -}}
{{- $root := . -}}
{{- if not (contains "/" (trimPrefix "/" $root)) -}}
{{- fail (printf "shim.hostPath.allowedRoots: %q is a top-level directory; allow a directory of its own such as /opt/rdma-streams" $root) -}}
{{- end -}}
{{- range $denied -}}
{{- if include "rdma-streams.pathUnder" (dict "path" $root "root" .) -}}
{{- fail (printf "shim.hostPath.allowedRoots: %q is a system directory (under %s); pods would mount it from the node" $root .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $v.shim.delivery "host-path" -}}
{{- include "rdma-streams.validate.absPath" (dict "name" "shim.hostPath.root" "value" $v.shim.hostPath.root) -}}
{{- $ok := false -}}
{{- range $v.shim.hostPath.allowedRoots -}}
{{- if include "rdma-streams.pathUnder" (dict "path" $v.shim.hostPath.root "root" .) -}}
{{- $ok = true -}}
{{- end -}}
{{- end -}}
{{- if not $ok -}}
{{- fail (printf "shim.hostPath.root %q is not equal to or below any of shim.hostPath.allowedRoots (%s): pick a root under them, or add a dedicated directory to allowedRoots" $v.shim.hostPath.root (join ", " $v.shim.hostPath.allowedRoots)) -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9_][A-Za-z0-9_.-]*$" (include "rdma-streams.shim.version" .)) -}}
{{- fail (printf "shim.image.tag %q cannot name the host-path directory <root>/<tag>" (include "rdma-streams.shim.version" .)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.shim.policy (not (and (eq $v.shim.delivery "host-path") $v.shim.hostPath.installer.enabled)) -}}
{{- fail "shim.policy is delivered only with shim.delivery=host-path and shim.hostPath.installer.enabled=true (the installer writes it next to the library); with init-copy or image-volume, bake the policy into the bundle image and set STREAMSHIM_POLICY in shim.env" -}}
{{- end -}}

{{/* gateway */}}
{{- if $v.kubevirt.enabled -}}
{{- include "rdma-streams.validate.oneOf" (dict "name" "gateway.logFormat" "value" $v.gateway.logFormat "allowed" (list "text" "json")) -}}
{{- if lt (int $v.gateway.rdmaResource.count) 1 -}}
{{- fail "gateway.rdmaResource.count must be at least 1: the gateway gets its /dev/infiniband nodes through the device plugin" -}}
{{- end -}}
{{- if eq (int $v.gateway.port) (int $v.gateway.adminPort) -}}
{{- fail "gateway.port and gateway.adminPort must differ (both are host ports)" -}}
{{- end -}}
{{- with $v.gateway.peerAuth.existingSecret -}}
{{- include "rdma-streams.validate.peerKeys" (dict "namespace" $.Release.Namespace "name" . "secret" (lookup "v1" "Secret" $.Release.Namespace .)) -}}
{{- end -}}
{{- end -}}
{{- if eq (int $v.injector.port) (int $v.injector.adminPort) -}}
{{- fail "injector.port and injector.adminPort must differ" -}}
{{- end -}}
{{- end -}}

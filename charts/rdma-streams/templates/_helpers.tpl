{{/*
Names, labels and images shared by every template.
*/}}

{{- define "rdma-streams.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 42 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every resource name; cut to 42 characters so "-shim-installer" still fits 63. */}}
{{- define "rdma-streams.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 42 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rdma-streams.devicePlugin.fullname" -}}{{ include "rdma-streams.fullname" . }}-device-plugin{{- end -}}
{{- define "rdma-streams.injector.fullname" -}}{{ include "rdma-streams.fullname" . }}-injector{{- end -}}
{{- define "rdma-streams.gateway.fullname" -}}{{ include "rdma-streams.fullname" . }}-gateway{{- end -}}
{{/* The Secret of the gateways' peer keys: the admin's own, or the one the chart makes. */}}
{{- define "rdma-streams.gateway.peerKeysSecret" -}}
{{- .Values.gateway.peerAuth.existingSecret | default (printf "%s-peer-keys" (include "rdma-streams.gateway.fullname" .)) -}}
{{- end -}}
{{/* The ValidatingAdmissionPolicy (and its binding) that limits the gateway's Node patches. */}}
{{- define "rdma-streams.gateway.nodePolicy" -}}{{ include "rdma-streams.gateway.fullname" . }}-node-patch{{- end -}}
{{/* The user name the API server gives the gateway's service account token. */}}
{{- define "rdma-streams.gateway.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "rdma-streams.gateway.fullname" .) -}}
{{- end -}}
{{/* Where the gateway reads its peer keys (RDMA_GW_PEER_KEYS_FILE): the Secret's key `keys`. */}}
{{- define "rdma-streams.gateway.peerKeysDir" -}}/etc/rdma-streams/gateway/peer-keys{{- end -}}
{{- define "rdma-streams.installer.fullname" -}}{{ include "rdma-streams.fullname" . }}-shim-installer{{- end -}}
{{/* The injector's Service, also its --service (certificate names, CA Secret "<service>-ca"). */}}
{{- define "rdma-streams.injector.serviceName" -}}{{ include "rdma-streams.injector.fullname" . }}{{- end -}}
{{/* The MutatingWebhookConfiguration, also the injector's --webhook-config. */}}
{{- define "rdma-streams.webhook.name" -}}{{ include "rdma-streams.injector.fullname" . }}{{- end -}}
{{- define "rdma-streams.injector.tlsSecret" -}}{{ include "rdma-streams.injector.fullname" . }}-tls{{- end -}}
{{- define "rdma-streams.injector.certificate" -}}{{ include "rdma-streams.injector.fullname" . }}-tls{{- end -}}

{{- define "rdma-streams.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "rdma-streams.labels" -}}
helm.sh/chart: {{ include "rdma-streams.chart" . }}
app.kubernetes.io/name: {{ include "rdma-streams.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rdma-streams
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "injector"). */}}
{{- define "rdma-streams.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rdma-streams.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component's objects. */}}
{{- define "rdma-streams.componentLabels" -}}
{{ include "rdma-streams.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: (dict "ctx" $ "image" .Values.x.image). */}}
{{- define "rdma-streams.image" -}}
{{- $repo := .image.repository -}}
{{- if .ctx.Values.imageRegistry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .ctx.Values.imageRegistry) $repo -}}
{{- end -}}
{{- $tag := .image.tag | default .ctx.Chart.AppVersion -}}
{{- if .image.digest -}}
{{- printf "%s:%s@%s" $repo $tag .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{/* The shim bundle's version: its image tag, also the host-path subdirectory. */}}
{{- define "rdma-streams.shim.version" -}}
{{- .Values.shim.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{/* The node directory of host-path delivery: <root>/<version>. */}}
{{- define "rdma-streams.shim.hostDir" -}}
{{- printf "%s/%s" .Values.shim.hostPath.root (include "rdma-streams.shim.version" .) -}}
{{- end -}}

{{/* Where the installer writes the shim policy, relative to the bundle directory. */}}
{{- define "rdma-streams.shim.policyFile" -}}streamshim-policy.yaml{{- end -}}

{{/* The extended resource injected pods request. */}}
{{- define "rdma-streams.resourceName" -}}
{{- if .Values.injector.profile.resource.name -}}
{{- .Values.injector.profile.resource.name -}}
{{- else -}}
{{- (first .Values.devicePlugin.pools).resourceName -}}
{{- end -}}
{{- end -}}

{{- define "rdma-streams.gateway.resourceName" -}}
{{- if .Values.gateway.rdmaResource.name -}}
{{- .Values.gateway.rdmaResource.name -}}
{{- else -}}
{{- (first .Values.devicePlugin.pools).resourceName -}}
{{- end -}}
{{- end -}}

{{/* Namespaces never sent to the webhook: the system ones, ours, and the configured extras. */}}
{{- define "rdma-streams.webhook.excludedNamespaces" -}}
{{- $ns := list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace -}}
{{- range .Values.webhook.excludeNamespaces -}}
{{- $ns = append $ns . -}}
{{- end -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/* Pod-level security context of every non-root pod of the chart. */}}
{{- define "rdma-streams.podSecurityContext.nonRoot" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context: no privilege escalation, read-only root, no capabilities. */}}
{{- define "rdma-streams.containerSecurityContext.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

#!/bin/sh
# images/assemble-shim-bundle.sh SHIM LIBDIR OUT [MOUNT_PATH]: lays out the shim bundle image's
# root filesystem in OUT (Dockerfile.shim-bundle runs it in its Debian 11 build stage).
#
#   SHIM        libstreamshim.so (built against glibc 2.31)
#   LIBDIR      where rdma-core and libnl live in the build stage (/usr/lib/x86_64-linux-gnu;
#               libnl-3 may sit in the /lib twin of it, which is searched too)
#   OUT         the image root to fill
#   MOUNT_PATH  where pods see the bundle (default /opt/rdma-streams, the chart's shim.mountPath
#               and the injector's DEFAULT_MOUNT_PATH); only used to write bundle.env
#
# Layout (the injector's library path is <mountPath>/lib/libstreamshim.so):
#
#   /bundle/lib/libstreamshim.so           the shim (LD_PRELOAD)
#   /bundle/lib/librdmacm.so.1             the connection manager (STREAMSHIM_PROVIDER)
#   /bundle/lib/libibverbs.so.1            its verbs library
#   /bundle/lib/libnl-3.so.200, libnl-route-3.so.200
#   /bundle/lib/libibverbs/lib<p>-rdmav<N>.so   verbs providers (RDMAV_DRIVERS)
#   /bundle/bundle.env                     the environment pods need, for MOUNT_PATH
#   /lib -> bundle/lib, /bundle.env -> bundle/bundle.env
#                                          so that the image root is the bundle too
#                                          (image-volume delivery mounts the image root)
#   /bin/busybox and sh, cp, mv, rm, ...   static: init-copy and the host-path installer
#
# Every bundled library is a real file named by its soname (no symlinks: `cp -R` copies them
# as they are, and the host-path installer copies into node directories) with RPATH $ORIGIN
# (providers: $ORIGIN/..), so librdmacm finds the bundled libibverbs and libnl before anything
# in the app image or LD_LIBRARY_PATH (DT_RPATH, unlike DT_RUNPATH, is searched first). /lib of
# the image holds nothing but the bundle: a RPATH of $ORIGIN must never reach a glibc library
# of another version.
set -eu

[ $# -ge 3 ] || {
	echo "usage: $0 SHIM LIBDIR OUT [MOUNT_PATH]" >&2
	exit 2
}
shim=$1
libdir=$2
out=$3
mount_path=${4:-/opt/rdma-streams}
lib=$out/bundle/lib

command -v patchelf >/dev/null || {
	echo "assemble-shim-bundle: patchelf not found" >&2
	exit 1
}

# find_lib SONAME: the library in LIBDIR or its /lib twin (Debian 11 is not merged-/usr).
find_lib() {
	for dir in "$libdir" "${libdir%/usr/lib/*}/lib/${libdir##*/usr/lib/}"; do
		if [ -e "$dir/$1" ]; then
			echo "$dir/$1"
			return 0
		fi
	done
	echo "assemble-shim-bundle: $1 not found in $libdir" >&2
	return 1
}

mkdir -p "$lib/libibverbs"
cp -L "$shim" "$lib/libstreamshim.so"
chmod 0755 "$lib/libstreamshim.so"

for soname in librdmacm.so.1 libibverbs.so.1 libnl-3.so.200 libnl-route-3.so.200; do
	src=$(find_lib "$soname")
	cp -L "$src" "$lib/$soname"
	# shellcheck disable=SC2016 # $ORIGIN is for the dynamic loader, not the shell
	patchelf --force-rpath --set-rpath '$ORIGIN' "$lib/$soname"
done

providers=""
for provider in "$libdir"/libibverbs/lib*-rdmav*.so; do
	[ -e "$provider" ] || {
		echo "assemble-shim-bundle: no verbs providers in $libdir/libibverbs" >&2
		exit 1
	}
	name=${provider##*/}
	cp -L "$provider" "$lib/libibverbs/$name"
	# shellcheck disable=SC2016
	patchelf --force-rpath --set-rpath '$ORIGIN/..' "$lib/libibverbs/$name"
	# RDMAV_DRIVERS entries are paths without the "-rdmav<N>.so" suffix, which libibverbs
	# appends itself (load_driver in libibverbs/dynamic_driver.c).
	providers="$providers${providers:+:}$mount_path/lib/libibverbs/${name%-rdmav*.so}"
done
chmod 0644 "$lib"/lib*.so.* "$lib"/libibverbs/*.so

# Nothing in the bundle may need a glibc newer than the oldest app image it promises to load in.
max_glibc=${MAX_GLIBC:-2.31}
for elf in "$lib"/*.so* "$lib"/libibverbs/*.so; do
	need=$(objdump -T "$elf" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -n1)
	if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$max_glibc" | sort -V | tail -n1)" != "$max_glibc" ]; then
		echo "assemble-shim-bundle: ${elf#"$out"/} needs glibc $need, newer than $max_glibc (MAX_GLIBC)" >&2
		exit 1
	fi
done

cat >"$out/bundle/bundle.env" <<EOF
# Environment for containers that preload this bundle at $mount_path (the chart's
# shim.mountPath). The injector sets LD_PRELOAD itself; set the rest through the profile env
# (chart: shim.env). With another mount path, replace the $mount_path prefix.
LD_PRELOAD=$mount_path/lib/libstreamshim.so
STREAMSHIM_PROVIDER=$mount_path/lib/librdmacm.so.1
RDMAV_DRIVERS=$providers
EOF

# The image root is the bundle as well (image-volume delivery), through relative links.
ln -s bundle/lib "$out/lib"
ln -s bundle/bundle.env "$out/bundle.env"

# A static busybox: sh, cp, mv, rm for init-copy and the chart's host-path installer. Static,
# so that /lib holds the bundle only.
busybox=${BUSYBOX:-/bin/busybox}
if ! file_out=$(od -An -c -N4 "$busybox" 2>/dev/null) || [ "$(echo "$file_out" | tr -d ' ')" != '177ELF' ]; then
	echo "assemble-shim-bundle: $busybox is not an ELF binary (install busybox-static)" >&2
	exit 1
fi
if ldd "$busybox" >/dev/null 2>&1; then
	echo "assemble-shim-bundle: $busybox is dynamically linked; the bundle needs busybox-static" >&2
	exit 1
fi
mkdir -p "$out/bin"
cp "$busybox" "$out/bin/busybox"
for applet in sh cp mv rm ls cat mkdir ln chmod echo test true sleep env; do
	ln -s busybox "$out/bin/$applet"
done
echo "assemble-shim-bundle: bundle in $out/bundle:"
(cd "$out" && find . | sort)
cat "$out/bundle/bundle.env"

#!/bin/sh
# images/stage-runtime.sh DEST PATH...: copies into DEST what PATHs need at run time on top of
# gcr.io/distroless/cc-debian12 (which has glibc, libgcc_s, libstdc++ and libgomp already):
# every PATH (a file, or a directory copied whole, such as a verbs provider directory or
# /etc/libibverbs.d) and the shared libraries every ELF among them needs, found with ldd,
# recursively. Files keep their path, with the directory part canonicalised (Debian 12 build
# images have merged /usr: /lib -> usr/lib), and are copied dereferenced, so DEST has no
# symlinks that could clash with the runtime image's own layout.
#
# Run in the build stage, where the same Debian 12 packages are installed. Prints what it copies.
set -eu

[ $# -ge 2 ] || {
	echo "usage: $0 DEST PATH..." >&2
	exit 2
}
dest=$1
shift
mkdir -p "$dest"

# Shared objects the distroless cc image provides (packages libc6, libgcc-s1, libstdc++6,
# libgomp1): never copied, so the runtime's glibc stays one consistent set.
provided() {
	case ${1##*/} in
	ld-linux*.so* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | \
		libutil.so.* | libresolv.so.* | libanl.so.* | libnsl.so.* | libnss_*.so.* | \
		libBrokenLocale.so.* | libmvec.so.* | libthread_db.so.* | libc_malloc_debug.so.* | \
		libgcc_s.so.* | libstdc++.so.* | libgomp.so.*)
		return 0
		;;
	esac
	return 1
}

is_elf() {
	[ -f "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' \n')" = '177ELF' ]
}

# copy_file SRC: SRC (dereferenced) to DEST/<canonical dir of SRC>/<basename of SRC>.
copy_file() {
	src=$1
	dir=$(cd "$(dirname "$src")" && pwd -P)
	target=$dest$dir/${src##*/}
	[ -e "$target" ] && return 0
	mkdir -p "$dest$dir"
	cp -L "$src" "$target"
	echo "stage-runtime: $dir/${src##*/}"
	if is_elf "$target"; then
		libs "$src"
	fi
}

# libs ELF: the libraries ldd resolves for ELF, minus the provided ones; fails on "not found".
libs() {
	out=$(ldd "$1" 2>&1) || {
		# "not a dynamic executable": static, nothing to add.
		case $out in *"not a dynamic executable"* | *"statically linked"*) return 0 ;; esac
		echo "stage-runtime: ldd $1 failed: $out" >&2
		exit 1
	}
	if printf '%s\n' "$out" | grep -q 'not found'; then
		echo "stage-runtime: $1 has unresolved libraries:" >&2
		printf '%s\n' "$out" | grep 'not found' >&2
		exit 1
	fi
	for lib in $(printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'); do
		provided "$lib" || copy_file "$lib"
	done
}

for path in "$@"; do
	if [ -d "$path" ]; then
		find "$path" \( -type f -o -type l \) | sort | while read -r file; do
			copy_file "$file"
		done
	elif [ -e "$path" ]; then
		copy_file "$path"
	else
		echo "stage-runtime: $path does not exist" >&2
		exit 1
	fi
done

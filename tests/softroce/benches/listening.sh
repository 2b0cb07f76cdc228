# Sourced by the bench scripts here.

# Waits until something listens on TCP port $1, at most $2 tries 50 ms apart (default 200:
# 10 s); 1, and a line on stderr, if nothing does.
wait_port() {
	local tries=${2:-200}
	for _ in $(seq 1 "$tries"); do
		ss -ltnH | grep -q ":$1 " && return 0
		sleep 0.05
	done
	echo "nothing listens on TCP port $1" >&2
	return 1
}

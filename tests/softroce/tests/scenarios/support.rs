//! What the shim scenarios share: the library under test, the real Python, a shimmed
//! command's environment, and the shim's stats files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use rdma_streams_softroce::Ctx;
use serde_json::Value;

/// The negotiation bound for scenarios that expect upgrades: rdma_cm connects take 50-300 ms
/// under TCG, the 200 ms default would make them flaky.
pub const NEGOTIATE_MS: u32 = 5000;

/// `libstreamshim.so` of this build (`STREAMSHIM_LIB` overrides): next to the test binary's
/// profile directory (`make test` builds it first).
pub fn shim() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("STREAMSHIM_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .context("the test binary is not in <target>/<profile>/deps")?;
    let candidates = [
        profile.join("libstreamshim.so"),
        profile.join("deps/libstreamshim.so"),
    ];
    candidates
        .iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .cloned()
        .with_context(|| {
            format!(
                "libstreamshim.so not found in {} (`cargo build -p rdma-streams-shim` first)",
                profile.display()
            )
        })
}

/// The real Python interpreter (not a pyenv shim script), so the shim lands in Python itself.
pub fn python() -> String {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| String::from("python3"))
    })
    .clone()
}

/// `env ...` words that run a command under the shim, its stats in `<tmp>/<tag>-<pid>.json`,
/// `extra` (more `K=V` words) last. The shim logs at `info` (`SOFTROCE_SHIM_LOG` overrides,
/// e.g. `debug` to see every connection).
pub fn shimmed(ctx: &Ctx, tag: &str, extra: &str) -> anyhow::Result<String> {
    let level = std::env::var("SOFTROCE_SHIM_LOG").unwrap_or_else(|_| String::from("info"));
    Ok(format!(
        "env LD_PRELOAD={} STREAMSHIM_STATS={}/{tag}-%p.json STREAMSHIM_NEGOTIATE_MS={NEGOTIATE_MS} STREAMSHIM_LOG={level} {extra}",
        shim()?.display(),
        ctx.tmp.display()
    ))
}

/// Writes `text` to `<tmp>/name` and returns the path.
pub fn file(ctx: &Ctx, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let p = ctx.tmp.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// Every stats file `<tmp>/<tag>-*.json`, by file name.
pub fn stats(ctx: &Ctx, tag: &str) -> anyhow::Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&ctx.tmp)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{tag}-")) && name.ends_with(".json") {
            let text = std::fs::read_to_string(entry.path())?;
            let v: Value =
                serde_json::from_str(&text).with_context(|| format!("{name}: {text}"))?;
            out.insert(name, v);
        }
    }
    Ok(out)
}

/// The summed counters of `role` over the stats files of `tag`: `{"rdma UPGRADED": n, "tcp
/// TIMEOUT": m, ...}`.
pub fn counts(ctx: &Ctx, tag: &str, role: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let files = stats(ctx, tag)?;
    ensure!(!files.is_empty(), "no stats file {tag}-*.json");
    let mut out = BTreeMap::new();
    for v in files.values() {
        for path in ["rdma", "tcp"] {
            if let Some(m) = v[role][path].as_object() {
                for (reason, n) in m {
                    *out.entry(format!("{path} {reason}")).or_insert(0) += n.as_u64().unwrap_or(0);
                }
            }
        }
    }
    out.retain(|_, n| *n > 0);
    Ok(out)
}

/// Fails unless `role` of `tag` counted exactly `want` (e.g. `[("rdma UPGRADED", 2)]`).
pub fn expect_counts(ctx: &Ctx, tag: &str, role: &str, want: &[(&str, u64)]) -> anyhow::Result<()> {
    let got = counts(ctx, tag, role)?;
    let want: BTreeMap<String, u64> = want.iter().map(|(k, n)| ((*k).to_owned(), *n)).collect();
    ctx.log(format_args!("{tag} {role}: {got:?}"));
    if got != want {
        bail!("{tag} {role} counted {got:?}, expected {want:?}");
    }
    Ok(())
}

/// Checks that the upgraded connections of `tag` carried at least `want` bytes each way that
/// `both` says (else sent only), counting their first bytes, which go over TCP before the
/// move (`tcp_bytes_before_move`), and that their streams carried most of them.
pub fn expect_carried(ctx: &Ctx, tag: &str, want: u64, both: bool) -> anyhow::Result<()> {
    let stream = summed(ctx, tag, "rdma_bytes")?;
    let before = summed(ctx, tag, "tcp_bytes_before_move")?;
    let ways = [("out", stream.0, before.0), ("in", stream.1, before.1)];
    for (way, on_stream, first) in ways.into_iter().take(if both { 2 } else { 1 }) {
        ensure!(
            on_stream + first >= want && on_stream > first,
            "{tag}'s connections carried {on_stream} bytes {way} on their streams and {first} \
             over TCP before the move, of at least {want}"
        );
    }
    Ok(())
}

/// The summed (sent, received) of the byte counts `counts` over the stats files of `tag`.
fn summed(ctx: &Ctx, tag: &str, counts: &str) -> anyhow::Result<(u64, u64)> {
    summed_pair(ctx, tag, counts, ("sent", "received"))
}

/// The sums of the two counters `keys` of the group `group` over the stats files of `tag`.
fn summed_pair(
    ctx: &Ctx,
    tag: &str,
    group: &str,
    keys: (&str, &str),
) -> anyhow::Result<(u64, u64)> {
    let files = stats(ctx, tag)?;
    let sum = |key: &str| {
        files
            .values()
            .map(|v| v[group][key].as_u64().unwrap_or(0))
            .sum()
    };
    Ok((sum(keys.0), sum(keys.1)))
}

/// The summed `tcp_bytes_before_move.sent` and its `direct` part (the bytes the apps'
/// threads sent on the TCP connections themselves) over the stats files of `tag`.
pub fn sent_before_move(ctx: &Ctx, tag: &str) -> anyhow::Result<(u64, u64)> {
    summed_pair(ctx, tag, "tcp_bytes_before_move", ("sent", "direct"))
}

/// The summed `rdma_bytes.direct` and `rdma_bytes.direct_written` (bytes read straight from
/// the receive rings, written straight into the send rings) over the stats files of `tag`.
pub fn direct_bytes(ctx: &Ctx, tag: &str) -> anyhow::Result<(u64, u64)> {
    summed_pair(ctx, tag, "rdma_bytes", ("direct", "direct_written"))
}

/// `wait_port PORT`: a shell function that waits (20 s) for a TCP listener on PORT.
pub const WAIT_PORT: &str = r#"wait_port() {
  for _ in $(seq 1 400); do
    ss -ltnH | grep -q ":$1 " && return 0
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2; return 1
}
"#;

/// Waits until `path` holds a line starting with `word`.
pub fn wait_line(
    ctx: &Ctx,
    path: &std::path::Path,
    word: &str,
    limit: Duration,
) -> anyhow::Result<String> {
    let end = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l.starts_with(word)) {
            return Ok(text);
        }
        if Instant::now() >= end || ctx.remaining() < Duration::from_secs(2) {
            bail!("no `{word}` in {} within {limit:?}: {text}", path.display());
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// `VmPin` (bytes) and the open fds of process `pid`.
pub fn footprint(pid: u32) -> anyhow::Result<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let pin = status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .context("no VmPin")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((pin * 1024, fds))
}

/// The interface of this guest that holds the IPv4 address `addr`.
pub fn interface_of(ctx: &Ctx, addr: std::net::Ipv4Addr) -> anyhow::Result<String> {
    let nic = ctx
        .sh(&format!(
            "ip -o -4 addr show to {addr} | awk '{{print $2}}'"
        ))?
        .stdout
        .trim()
        .to_owned();
    ensure!(!nic.is_empty(), "no interface holds {addr}");
    Ok(nic)
}

/// A Service's virtual IP on this guest as kube-proxy programs it for a pod's node: `vip`
/// routed out of the interface holding `src`, and nftables DNAT in the output hook (table
/// `table`) of each `(port, destination)`. Returns the interface, for [`undo_service_dnat`].
pub fn service_dnat(
    ctx: &Ctx,
    (table, vip): (&str, &str),
    src: std::net::Ipv4Addr,
    rules: &[(u16, String)],
) -> anyhow::Result<String> {
    let nic = interface_of(ctx, src)?;
    let mut script = format!(
        "ip route replace {vip}/32 dev {nic} src {src} && nft add table ip {table} && \
         nft add chain ip {table} out '{{ type nat hook output priority -100; }}'"
    );
    for (port, to) in rules {
        script.push_str(&format!(
            " && nft add rule ip {table} out ip daddr {vip} tcp dport {port} dnat to {to}"
        ));
    }
    ctx.sh(&script)?;
    Ok(nic)
}

/// Removes what [`service_dnat`] set up.
pub fn undo_service_dnat(ctx: &Ctx, (table, vip): (&str, &str), nic: &str) -> anyhow::Result<()> {
    ctx.sh(&format!(
        "nft delete table ip {table}; ip route del {vip}/32 dev {nic}; true"
    ))
    .map(drop)
}

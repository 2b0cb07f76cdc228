//! The shim between two guests joined by a real wire (QEMU's socket netdev; rxe0 on each
//! guest's NIC): iperf3 and curl, each end counting its own side `rdma UPGRADED`.

use std::time::Duration;

use anyhow::ensure;
use rdma_streams_softroce::{Ctx, Role, Scenario, Topology};

use super::support::{WAIT_PORT, expect_counts, file, python, shimmed};

pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "shim_wire_iperf3_and_curl_between_two_guests",
    topology: Topology::Wire,
    timeout: Duration::from_secs(600),
    run: iperf3_and_curl,
}];

/// Serves `<dir>/data.bin` once over HTTP.
const HTTP_ONCE: &str = include_str!("scripts/http_once.py");

fn iperf3_and_curl(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let t = ctx.tmp.display().to_string();
    match ctx.role {
        Role::A => {
            ctx.sh(&format!("head -c 33554432 /dev/urandom > {t}/data.bin && sha256sum {t}/data.bin | cut -d' ' -f1 > {}/wire-sha", ctx.work.display()))?;
            let iperf = ctx.spawn(&format!(
                "{} iperf3 -s -1 -B {a} -p 5201",
                shimmed(ctx, "iperfsrv", "")?
            ))?;
            // Not `http.py`: the script's directory comes first on sys.path, and the
            // script would import itself as `http`.
            let http = file(ctx, "serve_once.py", HTTP_ONCE)?;
            let web = ctx.spawn(&format!(
                "{} {} {} {t} {a} 8000",
                shimmed(ctx, "websrv", "")?,
                python(),
                http.display()
            ))?;
            ctx.sh(&format!("{WAIT_PORT} wait_port 5201 && wait_port 8000"))?;
            ctx.barrier("listening")?;
            ensure!(
                ctx.wait("iperf3 server", iperf)?.success(),
                "iperf3 server failed"
            );
            ensure!(
                ctx.wait("http server", web)?.success(),
                "http server failed"
            );
            expect_counts(ctx, "iperfsrv", "server", &[("rdma UPGRADED", 2)])?;
            expect_counts(ctx, "websrv", "server", &[("rdma UPGRADED", 1)])?;
            ctx.barrier("done")
        }
        _ => {
            ctx.barrier("listening")?;
            let out = ctx.sh(&format!(
                "{} iperf3 -c {a} -p 5201 -t 3",
                shimmed(ctx, "iperfcli", "")?
            ))?;
            ensure!(out.stdout.contains("iperf Done."), "iperf3 did not finish");
            ctx.sh(&format!(
                "{} curl -sS --fail --max-time 240 -o {t}/got.bin http://{a}:8000/data.bin",
                shimmed(ctx, "webcli", "")?
            ))?;
            let got = ctx
                .sh(&format!("sha256sum {t}/got.bin | cut -d' ' -f1"))?
                .stdout;
            let want = std::fs::read_to_string(ctx.work.join("wire-sha"))?;
            ensure!(
                got.trim() == want.trim(),
                "sha256 {} against {}",
                got.trim(),
                want.trim()
            );
            expect_counts(ctx, "iperfcli", "client", &[("rdma UPGRADED", 2)])?;
            expect_counts(ctx, "webcli", "client", &[("rdma UPGRADED", 1)])?;
            ctx.barrier("done")
        }
    }
}

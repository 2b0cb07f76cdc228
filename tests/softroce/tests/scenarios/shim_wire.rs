//! The shim between two guests joined by a real wire (QEMU's socket netdev; rxe0 on each
//! guest's NIC): iperf3 and curl, each end counting its own side `rdma UPGRADED`; and a
//! Kubernetes Service's virtual IP on the client's node, upgraded through its backend.

use std::time::Duration;

use anyhow::ensure;
use rdma_streams_softroce::{Ctx, Role, Scenario, Topology};

use super::support::{
    WAIT_PORT, direct_bytes, expect_counts, file, python, service_dnat, shimmed, undo_service_dnat,
};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "shim_wire_iperf3_and_curl_between_two_guests",
        topology: Topology::Wire,
        timeout: Duration::from_secs(600),
        run: iperf3_and_curl,
    },
    Scenario {
        name: "shim_wire_service_vip_upgrades_through_the_backend",
        topology: Topology::Wire,
        timeout: Duration::from_secs(300),
        run: service_vip,
    },
];

/// Serves `<dir>/data.bin` once over HTTP.
const HTTP_ONCE: &str = include_str!("scripts/http_once.py");

/// 64 KiB requests to an echo server for a while, on each of N connections.
pub const ROUNDS_CLIENT: &str = include_str!("scripts/rounds_client.py");

/// A client whose forked child connects too.
const FORKED_CLIENT: &str = include_str!("scripts/forked_client.py");

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

/// A Kubernetes Service's virtual IP as kube-proxy programs it on the client's node: nftables
/// DNAT in guest B's output hook of the VIP's port 80 to a shimmed echo server on guest A, and
/// of its port 81 to a plain one. A client told the Service CIDR (`STREAMSHIM_SERVICE_CIDRS`,
/// as the chart's `shim.serviceCIDRs` sets it) makes three connections of 64 KiB echoes for a
/// second each through the VIP to the shimmed server: every one upgrades (`UPGRADED` on both
/// sides), the backend connecting back to the client's own address, every echo exact. Then
/// four short connections (one 256 KiB echo each) to the plain server: relayed over TCP while
/// the client waits for a connection back that never comes, each ends first (`ENDED_FIRST`),
/// and after three in a row the fourth stays TCP at once (`NEGATIVE_CACHE`); bytes exact.
/// Then a client whose forked child (no exec, as a pre-fork server's worker) connects through
/// the VIP twice after the parent once: its parent's engine expects the connections back, all
/// three upgraded. Last, nginx behind the VIP's port 82 (a master and two workers, which accept
/// in fork children: the master's engine connects back) serves a 20 MB file five times to
/// curl: every connection upgraded on both sides, sha256-exact.
fn service_vip(ctx: &Ctx) -> anyhow::Result<()> {
    const VIP: &str = "10.96.0.10";
    const CIDRS: &str = "STREAMSHIM_SERVICE_CIDRS=10.96.0.0/12 STREAMSHIM_NEGOTIATE_MS=200";
    let (a, b) = (ctx.addr_a, ctx.addr_b);
    let py = python();
    match ctx.role {
        Role::A => {
            let t = ctx.tmp.display().to_string();
            ctx.sh(&format!(
                "chmod 1777 {t} && mkdir -p {t}/www && \
                 head -c 20000000 /dev/urandom > {t}/www/big.bin && \
                 sha256sum {t}/www/big.bin | cut -d' ' -f1 > {}/svc-sha",
                ctx.work.display()
            ))?;
            let server = file(ctx, "server.py", super::shim_faults::ECHO_SERVER)?;
            let shimmed_server = ctx.spawn(&format!(
                "{} {py} {} {a} 9790 6 0",
                shimmed(ctx, "svcsrv", "")?,
                server.display()
            ))?;
            let plain_server = ctx.spawn(&format!("{py} {} {a} 9791 4 0", server.display()))?;
            let conf = file(ctx, "nginx.conf", &nginx_config(ctx, 9794))?;
            let nginx = ctx.spawn(&format!(
                "exec {} nginx -p {t} -c {} -e stderr",
                shimmed(ctx, "svcngx", "")?,
                conf.display()
            ))?;
            ctx.sh(&format!(
                "{WAIT_PORT} wait_port 9790 && wait_port 9791 && wait_port 9794"
            ))?;
            ctx.barrier("svc-listening")?;
            ensure!(
                ctx.wait("shimmed server", shimmed_server)?.success(),
                "the shimmed server failed"
            );
            ensure!(
                ctx.wait("plain server", plain_server)?.success(),
                "the plain server failed"
            );
            expect_counts(ctx, "svcsrv", "server", &[("rdma UPGRADED", 6)])?;
            // Its connections are connected back (the stream comes after the swap): their
            // bytes are read and written straight from and into the rings all the same.
            let (read, written) = direct_bytes(ctx, "svcsrv")?;
            ctx.report(format_args!(
                "the backend's connections back: {read} bytes read straight from the rings, \
                 {written} written straight into them"
            ));
            ensure!(
                read > 0 && written > 0,
                "the backend's connections back read {read} and wrote {written} bytes directly"
            );
            ctx.barrier("svc-curl-done")?;
            ctx.sh(&format!("kill -QUIT $(cat {t}/nginx.pid)"))?;
            ensure!(ctx.wait("nginx", nginx)?.success(), "nginx failed");
            expect_counts(ctx, "svcngx", "server", &[("rdma UPGRADED", CURLS)])?;
            ctx.barrier("svc-done")
        }
        _ => {
            ctx.barrier("svc-listening")?;
            let rules =
                [(80, 9790), (81, 9791), (82, 9794)].map(|(port, to)| (port, format!("{a}:{to}")));
            let nic = service_dnat(ctx, ("svc", VIP), b, &rules)?;
            let result = service_vip_clients(ctx, VIP, CIDRS)
                .and_then(|()| service_vip_curl(ctx, VIP, CIDRS));
            let cleanup = undo_service_dnat(ctx, ("svc", VIP), &nic);
            result?;
            cleanup?;
            ctx.barrier("svc-curl-done")?;
            ctx.barrier("svc-done")
        }
    }
}

fn service_vip_clients(ctx: &Ctx, vip: &str, env: &str) -> anyhow::Result<()> {
    let py = python();
    let rounds = file(ctx, "rounds_client.py", ROUNDS_CLIENT)?;
    let echo = file(ctx, "echo_client.py", super::shim_faults::ECHO_CLIENT)?;
    let up = ctx.sh(&format!(
        "{} {py} {} {vip} 80 3 1",
        shimmed(ctx, "svccli", env)?,
        rounds.display()
    ))?;
    ensure!(up.stdout.contains("rounds ok"), "the echoes failed");
    ctx.report(format_args!(
        "a shimmed client through the Service VIP {vip}:80 to a shimmed backend: {}",
        up.stdout.trim()
    ));
    expect_counts(ctx, "svccli", "client", &[("rdma UPGRADED", 3)])?;
    let plain = ctx.sh(&format!(
        "{} {py} {} {vip} 81 4",
        shimmed(ctx, "svcplain", env)?,
        echo.display()
    ))?;
    ensure!(plain.stdout.contains("echo ok"), "the echoes failed");
    ctx.report(format_args!(
        "a shimmed client through the Service VIP {vip}:81 to a plain backend: {}",
        plain.stdout.trim()
    ));
    expect_counts(
        ctx,
        "svcplain",
        "client",
        &[("tcp ENDED_FIRST", 3), ("tcp NEGATIVE_CACHE", 1)],
    )?;
    let forked = file(ctx, "forked_client.py", FORKED_CLIENT)?;
    let out = ctx.sh(&format!(
        "{} {py} {} {} {vip} 80 2 1",
        shimmed(ctx, "svcfork", env)?,
        forked.display(),
        rounds.display()
    ))?;
    ensure!(
        out.stdout.contains("forked ok") && out.stdout.matches("rounds ok").count() == 2,
        "the forked client failed: {}",
        out.stdout
    );
    ctx.report(format_args!(
        "a shimmed client and its fork child through the Service VIP {vip}:80: {}",
        out.stdout.trim().replace('\n', " | ")
    ));
    expect_counts(ctx, "svcfork", "client", &[("rdma UPGRADED", 3)])
}

/// nginx serving `<tmp>/www` on `port` of guest A's address: a master and two workers.
fn nginx_config(ctx: &Ctx, port: u16) -> String {
    let a = ctx.addr_a;
    let t = ctx.tmp.display();
    format!(
        "daemon off;
master_process on;
worker_processes 2;
pid {t}/nginx.pid;
error_log {t}/nginx-error.log info;
events {{ worker_connections 64; }}
http {{
  access_log off;
  sendfile on;
  client_body_temp_path {t}/ngx-body;
  proxy_temp_path {t}/ngx-proxy;
  fastcgi_temp_path {t}/ngx-fastcgi;
  uwsgi_temp_path {t}/ngx-uwsgi;
  scgi_temp_path {t}/ngx-scgi;
  server {{ listen {a}:{port}; root {t}/www; }}
}}
"
    )
}

/// Downloads of nginx's 20 MB file through the VIP's port 82 by curl, one after the other.
const CURLS: u64 = 5;

/// [`CURLS`] curl downloads of nginx's 20 MB file through the VIP's port 82, sha256-exact, each
/// upgraded (the connection back of each comes while nginx's bytes are relayed over TCP, and
/// one whose binding came late would keep the next ones on TCP for the negative cache's while).
fn service_vip_curl(ctx: &Ctx, vip: &str, env: &str) -> anyhow::Result<()> {
    let t = ctx.tmp.display().to_string();
    let want = std::fs::read_to_string(ctx.work.join("svc-sha"))?;
    for _ in 0..CURLS {
        ctx.sh(&format!(
            "{} curl -sS --fail --max-time 240 -o {t}/big.got http://{vip}:82/big.bin",
            shimmed(ctx, "svccurl", env)?
        ))?;
        let got = ctx
            .sh(&format!("sha256sum {t}/big.got | cut -d' ' -f1"))?
            .stdout;
        ensure!(
            got.trim() == want.trim(),
            "sha256 {} against {}",
            got.trim(),
            want.trim()
        );
    }
    expect_counts(ctx, "svccurl", "client", &[("rdma UPGRADED", CURLS)])?;
    let (read, _) = direct_bytes(ctx, "svccurl")?;
    ctx.report(format_args!(
        "curl's connections expected back: {read} of {} MB read straight from the rings",
        20 * CURLS
    ));
    ensure!(read > 0, "curl read nothing straight from the rings");
    Ok(())
}

//! nginx as it runs in a container (`daemon off`, a master and two workers, `sendfile on`)
//! under `libstreamshim.so`, on real RDMA streams: the master listens (its engine holds the
//! RDMA listener), the workers accept, and every shimmed client's connection upgrades with
//! every byte exact: a 50 MB file, 20 small files each on a connection of its own, a keep-alive
//! load from `wrk`, a `reuseport` listener, and nginx as a reverse proxy to a shimmed upstream.

use std::time::Duration;

use anyhow::ensure;
use rdma_streams_softroce::{Ctx, Scenario, Topology};

use super::shim_apps::HTTP_SERVER;
use super::support::{WAIT_PORT, counts, expect_counts, file, python, shimmed};

pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "shim_nginx_master_and_workers_serve_upgraded",
    topology: Topology::Loop,
    timeout: Duration::from_secs(600),
    run: nginx,
}];

/// Ports: the static site, the `reuseport` listener, the proxy, its upstream.
const SITE: u16 = 9760;
const REUSEPORT: u16 = 9761;
const PROXY: u16 = 9762;
const UPSTREAM: u16 = 9763;
/// Requests through the proxy (each on an upstream connection of its own).
const PROXIED: u32 = 3;

fn config(ctx: &Ctx) -> String {
    let a = ctx.addr_a;
    let t = ctx.tmp.display();
    format!(
        "daemon off;
master_process on;
worker_processes 2;
pid {t}/nginx.pid;
error_log {t}/nginx-error.log info;
events {{ worker_connections 256; }}
http {{
  access_log off;
  sendfile on;
  keepalive_requests 100000;
  client_body_temp_path {t}/ngx-body;
  proxy_temp_path {t}/ngx-proxy;
  fastcgi_temp_path {t}/ngx-fastcgi;
  uwsgi_temp_path {t}/ngx-uwsgi;
  scgi_temp_path {t}/ngx-scgi;
  server {{ listen {a}:{SITE}; root {t}/www; }}
  server {{ listen {a}:{REUSEPORT} reuseport; root {t}/www; }}
  server {{ listen {a}:{PROXY}; location / {{ proxy_pass http://{a}:{UPSTREAM}; }} }}
}}
"
    )
}

fn nginx(ctx: &Ctx) -> anyhow::Result<()> {
    let a = ctx.addr_a;
    let t = ctx.tmp.display().to_string();
    // The workers run as `nobody` (nginx's default under a root master), and write their
    // stats files here too.
    ctx.sh(&format!(
        "chmod 1777 {t} && mkdir -p {t}/www {t}/up && head -c 50000000 /dev/urandom > {t}/www/big.bin && \
         for i in $(seq 1 20); do head -c $((i * 1000)) /dev/urandom > {t}/www/s$i.bin; done && \
         head -c 3000000 /dev/urandom > {t}/up/p.bin"
    ))?;
    let conf = file(ctx, "nginx.conf", &config(ctx))?;
    let backend = file(ctx, "backend.py", HTTP_SERVER)?;
    let up = ctx.spawn(&format!(
        "{} {} {} {t}/up {a} {UPSTREAM} {PROXIED}",
        shimmed(ctx, "up", "")?,
        python(),
        backend.display()
    ))?;
    let srv = ctx.spawn(&format!(
        "exec {} nginx -p {t} -c {} -e stderr",
        shimmed(ctx, "ngx", "")?,
        conf.display()
    ))?;
    for port in [SITE, REUSEPORT, PROXY, UPSTREAM] {
        ctx.sh(&format!("{WAIT_PORT} wait_port {port}"))?;
    }
    let curl = |tag: &str| shimmed(ctx, tag, "");
    // One large file (sendfile into the upgraded connection).
    ctx.sh(&format!(
        "{} curl -sS --fail --max-time 240 -o {t}/big.got http://{a}:{SITE}/big.bin && \
         cmp {t}/big.got {t}/www/big.bin",
        curl("big")?
    ))?;
    // Many small ones, a connection each, on both listeners.
    for (port, tag) in [(SITE, "small"), (REUSEPORT, "rp")] {
        ctx.sh(&format!(
            "for i in $(seq 1 20); do {} curl -sS --fail --max-time 60 -o {t}/s$i.got \
             http://{a}:{port}/s$i.bin && cmp {t}/s$i.got {t}/www/s$i.bin || exit 1; done",
            curl(tag)?
        ))?;
    }
    // A keep-alive load: 16 connections for 3 s (and wrk's own first probe connection), with
    // the shim and, for the rate beside it, on plain TCP (17 more plain clients).
    let mut rates = Vec::new();
    for shim in [curl("wrk")?, String::new()] {
        let out = ctx.sh(&format!(
            "{shim} wrk -t 1 -c 16 -d 3s http://{a}:{SITE}/s5.bin"
        ))?;
        ensure!(
            !out.stdout.contains("Socket errors") && !out.stdout.contains("Non-2xx"),
            "wrk saw errors: {}",
            out.stdout
        );
        let rate: f64 = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("Requests/sec:"))
            .and_then(|r| r.trim().parse().ok())
            .unwrap_or(0.0);
        rates.push(rate);
    }
    ctx.report(format_args!(
        "wrk -c 16 keep-alive, 5 KB: {:.0} requests/s upgraded, {:.0} on TCP ({:.2}x)",
        rates[0],
        rates[1],
        rates[0] / rates[1].max(1.0)
    ));
    // Through the reverse proxy.
    for _ in 0..PROXIED {
        ctx.sh(&format!(
            "{} curl -sS --fail --max-time 60 -o {t}/p.got http://{a}:{PROXY}/p.bin && \
             cmp {t}/p.got {t}/up/p.bin",
            curl("proxied")?
        ))?;
    }
    // A plain client (a kubelet probe): TCP, as the plain wrk's 17 were.
    ctx.sh(&format!(
        "curl -sS --fail --max-time 60 -o /dev/null http://{a}:{SITE}/s1.bin"
    ))?;
    ensure!(ctx.wait("upstream", up)?.success(), "the upstream failed");
    ctx.sh(&format!("kill -QUIT $(cat {t}/nginx.pid)"))?;
    let done = ctx.wait("nginx", srv)?;
    ensure!(done.success(), "nginx failed");
    expect_counts(ctx, "big", "client", &[("rdma UPGRADED", 1)])?;
    expect_counts(ctx, "small", "client", &[("rdma UPGRADED", 20)])?;
    expect_counts(ctx, "rp", "client", &[("rdma UPGRADED", 20)])?;
    expect_counts(ctx, "wrk", "client", &[("rdma UPGRADED", 17)])?;
    expect_counts(
        ctx,
        "proxied",
        "client",
        &[("rdma UPGRADED", PROXIED.into())],
    )?;
    let clients = 1 + 20 + 20 + 17 + u64::from(PROXIED);
    expect_counts(
        ctx,
        "ngx",
        "server",
        &[("rdma UPGRADED", clients), ("tcp PEER_NOT_SHIMMED", 18)],
    )?;
    let upstream = counts(ctx, "ngx", "client")?;
    ctx.report(format_args!("nginx's upstream connections: {upstream:?}"));
    expect_counts(ctx, "ngx", "client", &[("rdma UPGRADED", PROXIED.into())])?;
    expect_counts(ctx, "up", "server", &[("rdma UPGRADED", PROXIED.into())])
}

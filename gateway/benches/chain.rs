//! `make bench`: a QEMU live migration (TCG, 256 MiB of random RAM, release gateway, fake
//! rsocket provider) through the same virt-handler-like relay chain three ways, in one run,
//! interleaved:
//!
//! - `gateway`: relay A -> captured -> gateway A -> RDMA stream (fake provider) -> gateway B
//!   -> relay B (the path the tests check);
//! - `chain`: the same relays, no gateway (relay A's TCP connection routed straight to relay B);
//! - `socat`: the gateways' place taken by a socat TCP relay on each node
//!   (relay A -> socat nodeA -> socat nodeB -> relay B).
//!
//! | ratio (median migration throughput) | goal   |
//! | ----------------------------------- | ------ |
//! | gateway / chain                     | >= 0.8 |
//! | gateway / socat                     | >= 2   |
//!
//! The fake provider carries the stream over kernel TCP, so this measures the gateway's own
//! cost (capture, frame, pump), not RDMA. Exits non-zero when a goal is missed.

#![allow(clippy::print_stdout)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::{collections::BTreeMap, time::Duration};

const ROUNDS: usize = 5;
const PORT: u16 = 49152;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let script = format!(
        "ROUNDS={ROUNDS}; P={PORT}\n\
         gw nodeA --peer 10.2.0.2=198.18.0.2:7471\ngw nodeB\n\
         ip netns exec vhB $PY $S/relay.py tcp-to-unix $P $T/dst.sock >$T/rb.out &\n\
         ip netns exec nodeA socat TCP-LISTEN:$P,bind=10.1.0.1,fork,reuseaddr TCP:198.18.0.2:$P &\n\
         ip netns exec nodeB socat TCP-LISTEN:$P,bind=198.18.0.2,fork,reuseaddr TCP:10.2.0.2:$P &\n\
         sleep 0.5\n\
         one() {{ # NAME RELAY_A_TARGET\n\
           ip netns exec vhA $PY $S/relay.py unix-to-tcp $T/src.sock $2 >$T/ra.out & local r=$!\n\
           for _ in $(seq 100); do grep -q ready $T/ra.out 2>/dev/null && break; sleep 0.05; done\n\
           echo \"RUN $1 $(migrate --no-verify | tail -1)\"\n\
           kill $r; wait $r 2>/dev/null || true\n\
         }}\n\
         for i in $(seq $ROUNDS); do\n\
           one chain 10.2.0.2:$P\n\
           started nodeB target u$i $P; started nodeA source u$i $P; wait_table vhA\n\
           one gateway 10.2.0.2:$P\n\
           ended nodeA u$i false; ended nodeB u$i false\n\
           one socat 10.1.0.1:$P\n\
         done\n\
         echo RDMA_A=$(metric nodeA 'rdma_gw_connections_total{{role=\"source\",path=\"rdma\"}}')\n"
    );
    let run = common::run(&script, Duration::from_secs(600));
    assert!(run.success, "benchmark script failed\n{run}");
    let mut secs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut mibs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in run.stdout.lines() {
        let Some(rest) = line.strip_prefix("RUN ") else {
            continue;
        };
        let (name, json) = rest.split_once(' ').expect("RUN NAME JSON");
        let v: serde_json::Value = serde_json::from_str(json).expect("tool JSON");
        assert_eq!(v["status"], "completed", "{name}: {v}");
        secs.entry(name.into())
            .or_default()
            .push(v["seconds"].as_f64().expect("seconds"));
        mibs.entry(name.into())
            .or_default()
            .push(v["mib_per_s"].as_f64().expect("mib_per_s"));
    }
    assert_eq!(
        run.num("RDMA_A") as usize,
        ROUNDS,
        "every gateway round must take the stream\n{run}"
    );
    println!("QEMU live migration, 256 MiB random RAM, TCG, median of {ROUNDS} (interleaved):\n");
    println!("| path    | migration s | MiB/s  |");
    println!("| ------- | ----------- | ------ |");
    let mut thr = BTreeMap::new();
    for name in ["gateway", "chain", "socat"] {
        let s = median(secs.get_mut(name).expect("runs"));
        let m = median(mibs.get_mut(name).expect("runs"));
        thr.insert(name, m);
        println!("| {name:<7} | {s:>11.3} | {m:>6.1} |");
    }
    let vs_chain = thr["gateway"] / thr["chain"];
    let vs_socat = thr["gateway"] / thr["socat"];
    println!();
    println!(
        "gateway / chain = {vs_chain:.2} (goal >= 0.8) {}",
        if vs_chain >= 0.8 { "ok" } else { "MISSED" }
    );
    println!(
        "gateway / socat = {vs_socat:.2} (goal >= 2) {}",
        if vs_socat >= 2.0 { "ok" } else { "MISSED" }
    );
    if vs_chain < 0.8 || vs_socat < 2.0 {
        std::process::exit(1);
    }
}

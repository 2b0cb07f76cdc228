//! The gateway between two "nodes" (network namespaces joined by a veth), each with a
//! "virt-handler" namespace running a relay that behaves like KubeVirt's migration proxy:
//!
//! ```text
//! source QEMU -> unix -> relay A (vhA) -> TCP 10.2.0.2:P, captured by nft -> gateway A (nodeA)
//!   -> TCP fallback (no RDMA here) -> relay B (vhB) -> unix -> dest QEMU
//! ```
//!
//! These machines have no RDMA device, so gateway A relays every captured connection over TCP
//! (`NO_DEVICE`, or the reason a scenario provokes) and gateway B accepts no stream. What runs
//! here for real: the capture (nftables in the virt-handler namespace, `SO_ORIGINAL_DST`),
//! the fallback relay byte for byte (QEMU migrations with a RAM check, sha256-checked parallel
//! connections), the fallback reasons that need no RDMA, the abort clean-up, the stale-table
//! clean-up, the namespace lookup by process name and the node hook.
//!
//! What needs a real RDMA path runs in the Soft-RoCE guests
//! (`scripts/softroce-migration.sh`, by hand with `tests/softroce`'s `guest` example: see the
//! script's header): a QEMU migration carried end to end over a stream, parallel streams,
//! `NO_PEER` (judged only once RDMA is usable), the peer gateway down (`PEER_REFUSED`), a
//! stream that cannot open in time (`TIMEOUT`), and the peer gateway killed mid-migration (the
//! reset reaches both QEMUs).
//!
//! Migrations come from the test bed's socket (`rdma-gateway-testbed --test-events-socket`), as the kube
//! watchers are not part of these tests, except in one scenario where this test process plays
//! virt-handler and starts the source side with a KubeVirt node hook call
//! (`--node-hooks-socket`). Every scenario runs under a hard timeout in its own network, PID
//! and mount namespace.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use common::{Run, host_has_rdma, run, serial};
use rdma_migration_gateway::kube::hooks_api::v1alpha1::{
    ExecuteNodeHookRequest, NodeContext, node_hook_service_client::NodeHookServiceClient,
};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(120);
const PORT: u16 = 49152;
const RAM: f64 = (256u64 << 20) as f64;

/// The QEMU tool's JSON result (its last line starting with `{`).
fn result(run: &Run) -> Value {
    let line = run
        .value("RESULT")
        .unwrap_or_else(|| panic!("no RESULT\n{run}"));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("RESULT is not JSON ({e})\n{run}"))
}

/// Both gateways, the migration announced on both, the relays up; then `body`; then the
/// figures every test reads.
fn scenario(gw_a: &str, gw_b: Option<&str>, body: &str) -> Run {
    scenario_env("", gw_a, gw_b, body)
}

/// [`scenario`] with `VAR=value` words before gateway A (`PROVIDER=...`).
fn scenario_env(a_env: &str, gw_a: &str, gw_b: Option<&str>, body: &str) -> Run {
    let start_b = match gw_b {
        Some(args) => format!("gw nodeB {args}\nstarted nodeB target u1 {PORT}\n"),
        None => String::new(),
    };
    let script = format!(
        "{a_env} gw nodeA {gw_a}\n{start_b}started nodeA source u1 {PORT}\nwait_table vhA\nrelays {PORT}\n\
         {body}\n\
         echo RDMA_A=$(metric nodeA 'rdma_gw_connections_total{{role=\"source\",path=\"rdma\"}}')\n\
         echo TCP_A=$(metric nodeA 'rdma_gw_connections_total{{role=\"source\",path=\"tcp\"}}')\n\
         echo TCP_BYTES_A=$(metric nodeA 'rdma_gw_bytes_total{{path=\"tcp\",direction=\"to_target\"}}')\n\
         echo USABLE_A=$(metric nodeA rdma_gw_rdma_usable)\n\
         for r in NO_PEER NO_PROVIDER NO_DEVICE PEER_REFUSED TIMEOUT RDMA_ERROR NO_PEER_KEY PEER_AUTH_FAILED; do \
           echo FALLBACK_$r=$(metric nodeA \"rdma_gw_fallbacks_total{{reason=\\\"$r\\\"}}\"); done\n"
    );
    run(&script, LIMIT)
}

const PEER: &str = "--peer 10.2.0.2=198.18.0.2:7471";

/// A migration that must complete over TCP, byte-exact, with every connection counted under
/// `reason` (`None`: not judged, the host has RDMA devices and its own reasons).
fn completes_over_tcp(a_env: &str, gw_a: &str, reason: Option<&str>) {
    let _s = serial();
    let run = scenario_env(a_env, gw_a, Some(""), "echo RESULT=$(migrate | tail -1)");
    run.assert_ok();
    let r = result(&run);
    assert_eq!(r["status"], "completed", "{run}");
    assert_eq!(r["ram_match"], true, "{run}");
    assert_eq!(run.num("RDMA_A"), 0.0, "{run}");
    assert!(run.num("TCP_A") >= 1.0, "{run}");
    assert!(
        run.num("TCP_BYTES_A") > RAM,
        "the RAM did not take the gateway's relay\n{run}"
    );
    if let Some(reason) = reason {
        assert_eq!(
            run.num(&format!("FALLBACK_{reason}")),
            run.num("TCP_A"),
            "{run}"
        );
        assert_eq!(run.num("USABLE_A"), 0.0, "{run}");
    }
}

#[test]
fn qemu_migration_without_rdma_is_captured_and_relayed_byte_exact() {
    // The system's librdmacm loads and sees no device.
    completes_over_tcp("", PEER, (!host_has_rdma()).then_some("NO_DEVICE"));
}

#[test]
fn missing_rdma_library_falls_back_with_no_provider() {
    completes_over_tcp(
        "PROVIDER=/nonexistent/librdmacm.so.1",
        PEER,
        Some("NO_PROVIDER"),
    );
}

#[test]
fn parallel_connections_are_all_carried() {
    let _s = serial();
    // The multifd shape: several parallel connections per migration, on two published
    // ports, each checked end to end with sha256. (QEMU 7.2 multifd channels through
    // relays may be accepted out of order, so plain connections stand in for it.)
    let body = "ip netns exec vhB $PY $S/hashsrv.py 0.0.0.0 49160 49161 >$T/hs.out &\n\
        for _ in $(seq 100); do grep -q ready $T/hs.out && break; sleep 0.05; done\n\
        started nodeB target u2 49160,49161\nstarted nodeA source u2 49160,49161\n\
        sleep 0.3\n\
        ip netns exec vhA $PY $S/hashcli.py 8 10.2.0.2:49160 10.2.0.2:49161 10.2.0.2:49160 \
        10.2.0.2:49161 10.2.0.2:49160 10.2.0.2:49161 10.2.0.2:49160 10.2.0.2:49161 | tee $T/hc.out\n\
        echo MATCHED=$(sed -n 's/^matched=//p' $T/hc.out)\n\
        echo VIA_A=$(grep -c ' 198.18.0.1 True' $T/hc.out)";
    let run = scenario(PEER, Some(""), body);
    run.assert_ok();
    assert_eq!(run.num("MATCHED"), 8.0, "{run}");
    assert_eq!(
        run.num("VIA_A"),
        8.0,
        "every connection captured and dialed by gateway A\n{run}"
    );
    assert_eq!(run.num("TCP_A"), 8.0, "{run}");
}

#[test]
fn abort_mid_migration_cleans_everything_up() {
    let _s = serial();
    let body = "A=$(cat $T/gw-nodeA.pid); B=$(cat $T/gw-nodeB.pid)\n\
        fds() { ls /proc/$1/fd | wc -l; }; threads() { ls /proc/$1/task | wc -l; }\n\
        ended nodeA u1 false; ended nodeB u1 false; sleep 2\n\
        FA=$(fds $A); FB=$(fds $B); TA=$(threads $A); TB=$(threads $B)\n\
        started nodeB target u1 49152; started nodeA source u1 49152; wait_table vhA\n\
        MIGRATE_TIMEOUT=40 migrate --max-bandwidth 16777216 --no-verify >$T/mig.out 2>$T/mig.err &\n\
        M=$!\n\
        for _ in $(seq 200); do [ \"$(metric nodeA rdma_gw_connections_active)\" -ge 1 ] && break; sleep 0.05; done\n\
        sleep 1\n\
        echo ACTIVE_BEFORE=$(metric nodeA rdma_gw_connections_active)\n\
        ended nodeA u1 true; ended nodeB u1 true\n\
        rc=0; wait $M || rc=$?; echo MIGRATE_RC=$rc\n\
        echo RESULT=$(tail -1 $T/mig.out)\n\
        for _ in $(seq 100); do [ $(fds $A) -le $FA ] && [ $(threads $A) -le $TA ] && \
          [ $(fds $B) -le $FB ] && [ $(threads $B) -le $TB ] && break; sleep 0.1; done\n\
        echo FD_LEAK_A=$(( $(fds $A) - FA )); echo FD_LEAK_B=$(( $(fds $B) - FB ))\n\
        echo THREAD_LEAK_A=$(( $(threads $A) - TA )); echo THREAD_LEAK_B=$(( $(threads $B) - TB ))\n\
        echo TABLES=$(tables vhA | wc -l)\n\
        echo ACTIVE_AFTER=$(metric nodeA rdma_gw_connections_active)\n\
        echo ACTIVE_AFTER_B=$(metric nodeB rdma_gw_connections_active)\n\
        echo ABORTED=$(metric nodeA 'rdma_gw_migrations_ended_total{role=\"source\",outcome=\"aborted\"}')";
    let run = scenario(PEER, Some(""), body);
    run.assert_ok();
    assert!(
        run.num("ACTIVE_BEFORE") >= 1.0,
        "bytes were not flowing\n{run}"
    );
    assert_ne!(
        run.num("MIGRATE_RC"),
        0.0,
        "the migration should fail\n{run}"
    );
    assert_ne!(result(&run)["status"], "completed", "{run}");
    for key in [
        "FD_LEAK_A",
        "FD_LEAK_B",
        "THREAD_LEAK_A",
        "THREAD_LEAK_B",
        "TABLES",
        "ACTIVE_AFTER",
        "ACTIVE_AFTER_B",
    ] {
        assert_eq!(run.num(key), 0.0, "{key}\n{run}");
    }
    assert_eq!(run.num("ABORTED"), 1.0, "{run}");
}

#[test]
fn non_migration_connections_are_never_redirected() {
    let _s = serial();
    // Listeners: the migration port and another port on the target virt-handler, and the
    // migration port on another address (nodeB itself). Only the first may be captured: a
    // captured connection reaches the listener from gateway A (its relay dials from nodeA,
    // 198.18.0.1), a direct one from virt-handler A's own address (10.1.0.2).
    let body = "ip netns exec vhB $PY $S/hashsrv.py 0.0.0.0 49170 49171 >$T/hs.out &\n\
        ip netns exec nodeB $PY $S/hashsrv.py 10.2.0.1 49170 >$T/hs2.out &\n\
        for _ in $(seq 100); do grep -q ready $T/hs.out && grep -q ready $T/hs2.out && break; sleep 0.05; done\n\
        started nodeB target u3 49170\nstarted nodeA source u3 49170\nsleep 0.3\n\
        ip netns exec vhA $PY $S/hashcli.py 1 10.2.0.2:49171 10.2.0.1:49170 10.2.0.2:49170 | tee $T/hc.out\n\
        echo OTHER_PORT=$(awk '$1==\"10.2.0.2:49171\" {print $2}' $T/hc.out)\n\
        echo OTHER_ADDR=$(awk '$1==\"10.2.0.1:49170\" {print $2}' $T/hc.out)\n\
        echo MIGRATION=$(awk '$1==\"10.2.0.2:49170\" {print $2}' $T/hc.out)\n\
        echo MATCHED=$(sed -n 's/^matched=//p' $T/hc.out)\n\
        echo UNMATCHED=$(metric nodeA rdma_gw_unmatched_connections_total)";
    let run = scenario(PEER, Some(""), body);
    run.assert_ok();
    assert_eq!(run.num("MATCHED"), 3.0, "{run}");
    assert_eq!(
        run.value("OTHER_PORT").as_deref(),
        Some("10.1.0.2"),
        "{run}"
    );
    assert_eq!(
        run.value("OTHER_ADDR").as_deref(),
        Some("10.1.0.2"),
        "{run}"
    );
    assert_eq!(
        run.value("MIGRATION").as_deref(),
        Some("198.18.0.1"),
        "{run}"
    );
    assert_eq!(
        run.num("TCP_A"),
        1.0,
        "only the migration connection\n{run}"
    );
    assert_eq!(run.num("UNMATCHED"), 0.0, "{run}");
}

#[test]
fn a_killed_gateway_leaves_no_redirect_behind() {
    let _s = serial();
    // Gateway A captures the migration port, then dies without a word (SIGKILL): the kernel
    // removes its table with the netlink socket that owned it, so virt-handler's next
    // connection reaches its destination straight, instead of a dead capture port.
    let script = "ip netns exec vhB $PY $S/hashsrv.py 0.0.0.0 49190 >$T/hs.out &\n\
        for _ in $(seq 100); do grep -q ready $T/hs.out && break; sleep 0.05; done\n\
        gw nodeA --peer 10.2.0.2=198.18.0.2:7471\n\
        started nodeA source u8 49190; wait_table vhA\n\
        echo TABLES_BEFORE=$(tables vhA | wc -l)\n\
        ip netns exec vhA $PY $S/hashcli.py 1 10.2.0.2:49190 >$T/before.out\n\
        echo PEER_BEFORE=$(awk '$1==\"10.2.0.2:49190\" {print $2}' $T/before.out)\n\
        A=$(cat $T/gw-nodeA.pid); kill -KILL $A; wait $A 2>/dev/null || true\n\
        for _ in $(seq 100); do [ -z \"$(tables vhA)\" ] && break; sleep 0.05; done\n\
        echo TABLES_AFTER=$(tables vhA | wc -l)\n\
        ip netns exec vhA $PY $S/hashcli.py 1 10.2.0.2:49190 | tee $T/after.out\n\
        echo MATCHED=$(sed -n 's/^matched=//p' $T/after.out)\n\
        echo PEER_AFTER=$(awk '$1==\"10.2.0.2:49190\" {print $2}' $T/after.out)";
    let run = run(script, LIMIT);
    run.assert_ok();
    assert_eq!(run.num("TABLES_BEFORE"), 1.0, "{run}");
    assert_eq!(
        run.value("PEER_BEFORE").as_deref(),
        Some("198.18.0.1"),
        "captured while gateway A lived\n{run}"
    );
    assert_eq!(
        run.num("TABLES_AFTER"),
        0.0,
        "the table outlived its gateway\n{run}"
    );
    assert_eq!(run.num("MATCHED"), 1.0, "{run}");
    assert_eq!(
        run.value("PEER_AFTER").as_deref(),
        Some("10.1.0.2"),
        "the connection went straight to the destination\n{run}"
    );
}

#[test]
fn the_capture_listener_waits_out_an_fd_limit() {
    let _s = serial();
    // Gateway A is left 3 file descriptors: one relayed connection at a time (the captured
    // socket and the dialed one). 8 parallel connections: the listener backs off while the
    // limit holds (no spinning), the connections wait in its backlog or for a descriptor to
    // dial with, and every one arrives sha256-exact.
    let script = "ip netns exec vhB $PY $S/hashsrv.py 0.0.0.0 49191 >$T/hs.out &\n\
        for _ in $(seq 100); do grep -q ready $T/hs.out && break; sleep 0.05; done\n\
        gw nodeA --peer 10.2.0.2=198.18.0.2:7471\n\
        started nodeA source u9 49191; wait_table vhA\n\
        A=$(cat $T/gw-nodeA.pid); F=$(ls /proc/$A/fd | wc -l)\n\
        prlimit --pid $A --nofile=$((F + 3)):$((F + 3))\n\
        cpu() { awk '{print $14 + $15}' /proc/$A/stat; }\n\
        C0=$(cpu); T0=$(date +%s%N)\n\
        d=10.2.0.2:49191\n\
        ip netns exec vhA $PY $S/hashcli.py 2 $d $d $d $d $d $d $d $d | tee $T/hc.out\n\
        echo CPU_TICKS=$(( $(cpu) - C0 )); echo WALL_MS=$(( ($(date +%s%N) - T0) / 1000000 ))\n\
        echo MATCHED=$(sed -n 's/^matched=//p' $T/hc.out)\n\
        echo VIA_A=$(grep -c ' 198.18.0.1 True' $T/hc.out)\n\
        echo ALIVE=$(kill -0 $A && echo 1 || echo 0)\n\
        grep -E 'WARN|ERROR' $T/gw-nodeA.log | tail -5 >&2 || true\n\
        echo ACCEPT_ERRORS=$(metric nodeA rdma_gw_capture_accept_errors_total)\n\
        echo TCP_A=$(metric nodeA 'rdma_gw_connections_total{role=\"source\",path=\"tcp\"}')";
    let run = run(script, LIMIT);
    run.assert_ok();
    assert_eq!(run.num("MATCHED"), 8.0, "{run}");
    assert_eq!(
        run.num("VIA_A"),
        8.0,
        "every one captured and relayed\n{run}"
    );
    assert_eq!(run.num("TCP_A"), 8.0, "{run}");
    assert_eq!(run.num("ALIVE"), 1.0, "{run}");
    assert!(
        run.num("ACCEPT_ERRORS") >= 1.0,
        "the limit was never hit: the test proves nothing\n{run}"
    );
    // A listener spinning on EMFILE burns a core for as long as the limit holds.
    let cpu_s = run.num("CPU_TICKS") / 100.0;
    let wall_s = run.num("WALL_MS") / 1000.0;
    assert!(
        cpu_s < 0.5 * wall_s + 0.2,
        "gateway A used {cpu_s} s of CPU in {wall_s} s\n{run}"
    );
}

#[test]
fn stale_tables_are_removed_at_start_and_every_table_on_sigterm() {
    let _s = serial();
    // A crashed gateway's table is in virt-handler's namespace before this one starts.
    let script = "ip netns exec vhA nft -f - <<'NFT'\n\
        add table ip rdma_gw_stale\n\
        add chain ip rdma_gw_stale out { type nat hook output priority -100; }\n\
        add table ip keep_me\n\
        NFT\n\
        echo BEFORE=$(tables vhA | wc -l)\n\
        gw nodeA --peer 10.2.0.2=198.18.0.2:7471\n\
        echo AFTER_START=$(tables vhA | wc -l)\n\
        started nodeA source u9 49152; wait_table vhA\n\
        echo DURING=$(tables vhA | wc -l)\n\
        A=$(cat $T/gw-nodeA.pid); kill -TERM $A\n\
        rc=0; wait $A || rc=$?; echo EXIT=$rc\n\
        echo AFTER_STOP=$(tables vhA | wc -l)\n\
        echo OTHERS=$(ip netns exec vhA nft list tables | grep -c keep_me)";
    let run = run(script, LIMIT);
    run.assert_ok();
    assert_eq!(run.num("BEFORE"), 1.0, "{run}");
    assert_eq!(run.num("AFTER_START"), 0.0, "{run}");
    assert_eq!(run.num("DURING"), 1.0, "{run}");
    assert_eq!(run.num("EXIT"), 0.0, "{run}");
    assert_eq!(run.num("AFTER_STOP"), 0.0, "{run}");
    assert_eq!(run.num("OTHERS"), 1.0, "tables of others stay\n{run}");
}

#[test]
fn virt_handler_namespace_is_found_by_process_name() {
    let _s = serial();
    // Relay A runs as a program named `virt-handler` (a copy of the Python interpreter), as
    // the real one is found with hostPID; gateway A locates its namespace by that name.
    let script = format!(
        "cp \"$(readlink -f $PY)\" $T/virt-handler\n\
         ip netns exec vhA $T/virt-handler $S/relay.py unix-to-tcp $T/src.sock 10.2.0.2:{PORT} >$T/relayA.out &\n\
         ip netns exec vhB $PY $S/relay.py tcp-to-unix {PORT} $T/dst.sock >$T/relayB.out &\n\
         for _ in $(seq 100); do [ $(cat $T/relayA.out $T/relayB.out 2>/dev/null | grep -c ready) = 2 ] && break; sleep 0.05; done\n\
         CAPTURE_ARGS='--capture-process virt-handler' gw nodeA {PEER}\ngw nodeB\n\
         started nodeB target u1 {PORT}\nstarted nodeA source u1 {PORT}\nwait_table vhA\n\
         echo RESULT=$(migrate | tail -1)\n\
         echo TCP_A=$(metric nodeA 'rdma_gw_connections_total{{role=\"source\",path=\"tcp\"}}')"
    );
    let run = run(&script, LIMIT);
    run.assert_ok();
    let r = result(&run);
    assert_eq!(r["status"], "completed", "{run}");
    assert_eq!(r["ram_match"], true, "{run}");
    assert_eq!(run.num("TCP_A"), 1.0, "captured by gateway A\n{run}");
}

/// The VMI virt-handler on nodeA sends with `PreMigrationSource`: opted in, migrating to
/// nodeB's virt-handler (10.2.0.2), which published [`PORT`].
fn hook_vmi() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": "vm-u1", "namespace": "default", "uid": "u1",
            "labels": { "rdma-streams.io/migration": "rdma" },
        },
        "spec": {},
        "status": { "migrationState": {
            "migrationUid": "m1",
            "sourceNode": "nodeA",
            "targetNode": "nodeB",
            "targetNodeAddress": "10.2.0.2",
            "targetDirectMigrationNodePorts": { PORT.to_string(): 0 },
        }},
    }))
    .unwrap()
}

/// Waits for `ready` (or the script's end), then calls `ExecuteNodeHook` on `socket` as
/// virt-handler would; the answer (or what went wrong) as one line.
fn call_node_hook(ready: &Path, socket: PathBuf, script_done: impl Fn() -> bool) -> String {
    let deadline = Instant::now() + LIMIT;
    while !ready.exists() {
        if script_done() || Instant::now() > deadline {
            return "error: the script never got ready".into();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let call = async {
            let channel = rdma_streams_common::uds::channel(&socket, Duration::from_secs(5), None)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let response = NodeHookServiceClient::new(channel)
                .execute_node_hook(ExecuteNodeHookRequest {
                    hook_point: "PreMigrationSource".into(),
                    vmi: hook_vmi(),
                    node_context: Some(NodeContext {
                        node_name: "nodeA".into(),
                    }),
                })
                .await
                .map_err(|e| format!("call: {e}"))?
                .into_inner();
            Ok::<_, String>(format!(
                "success={} message={}",
                response.success, response.message
            ))
        };
        match tokio::time::timeout(Duration::from_secs(30), call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => format!("error: {e}"),
            Err(_) => "error: no answer in 30 s".into(),
        }
    })
}

#[test]
fn node_hook_starts_the_source_side_before_the_first_connect() {
    let _s = serial();
    // The sockets live in a directory of this test process: the script's namespaces share the
    // file system, so this process reaches gateway A's socket as virt-handler would.
    let hooks = tempfile::tempdir().unwrap();
    let dir = hooks.path().to_path_buf();
    let socket = dir.join("plugins/nodeA/node.sock");
    let (ready, answer) = (dir.join("ready"), dir.join("answer"));
    // Gateway B learns the migration from the test events socket; gateway A only from the node hook.
    let script = format!(
        "gw nodeA {PEER} --node-name nodeA --node-hooks-socket {sock}\ngw nodeB\n\
         started nodeB target u1 {PORT}\nrelays {PORT}\n\
         [ -S {sock} ] || {{ echo 'no node hook socket'; exit 1; }}\n\
         echo SOCKET_MODE=$(stat -c %a {sock})\n\
         echo TABLES_BEFORE=$(tables vhA | wc -l)\n\
         touch {ready}\n\
         for _ in $(seq 1200); do [ -e {answer} ] && break; sleep 0.05; done\n\
         echo TABLES_AT_ANSWER=$(tables vhA | wc -l)\n\
         echo ANSWER=$(cat {answer} 2>/dev/null)\n\
         echo RESULT=$(migrate | tail -1)\n\
         echo RDMA_A=$(metric nodeA 'rdma_gw_connections_total{{role=\"source\",path=\"rdma\"}}')\n\
         echo TCP_A=$(metric nodeA 'rdma_gw_connections_total{{role=\"source\",path=\"tcp\"}}')\n\
         echo TCP_BYTES_A=$(metric nodeA 'rdma_gw_bytes_total{{path=\"tcp\",direction=\"to_target\"}}')\n\
         echo HOOK_STARTED=$(metric nodeA 'rdma_gw_node_hook_calls_total{{hook=\"PreMigrationSource\",outcome=\"started\"}}')\n\
         A=$(cat $T/gw-nodeA.pid); kill -TERM $A; rc=0; wait $A || rc=$?; echo EXIT=$rc\n\
         echo SOCKET_AFTER=$([ -e {sock} ] && echo present || echo gone)",
        sock = socket.display(),
        ready = ready.display(),
        answer = answer.display(),
    );
    let runner = std::thread::spawn(move || run(&script, LIMIT));
    let reply = call_node_hook(&ready, socket, || runner.is_finished());
    let tmp = dir.join("answer.tmp");
    std::fs::write(&tmp, format!("{reply}\n")).unwrap();
    std::fs::rename(&tmp, &answer).unwrap();
    let run = runner.join().unwrap();
    run.assert_ok();
    let reply = run.value("ANSWER").unwrap_or_default();
    assert!(reply.starts_with("success=true "), "{reply}\n{run}");
    assert!(reply.contains("carrying default/vm-u1"), "{reply}\n{run}");
    assert_eq!(run.value("SOCKET_MODE").as_deref(), Some("660"), "{run}");
    assert_eq!(run.num("TABLES_BEFORE"), 0.0, "{run}");
    assert_eq!(
        run.num("TABLES_AT_ANSWER"),
        1.0,
        "the capture is in place when virt-handler gets its answer\n{run}"
    );
    let r = result(&run);
    assert_eq!(r["status"], "completed", "{run}");
    assert_eq!(r["ram_match"], true, "{run}");
    // Captured by the capture the hook installed (relayed over TCP: no RDMA here).
    assert_eq!(run.num("RDMA_A"), 0.0, "{run}");
    assert_eq!(run.num("TCP_A"), 1.0, "{run}");
    assert!(
        run.num("TCP_BYTES_A") > RAM,
        "the RAM did not take the gateway\n{run}"
    );
    assert_eq!(run.num("HOOK_STARTED"), 1.0, "{run}");
    assert_eq!(run.num("EXIT"), 0.0, "{run}");
    assert_eq!(run.value("SOCKET_AFTER").as_deref(), Some("gone"), "{run}");
}

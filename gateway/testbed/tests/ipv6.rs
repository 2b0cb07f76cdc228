//! IPv6 migrations: capture (`ip6` table, `IP6T_SO_ORIGINAL_DST`) and the relay to the IPv6
//! destination, on the topology of `migration.rs` with IPv6 addresses added
//! (`scripts/topology6.sh`). Without RDMA here, gateway A relays the captured connections over
//! TCP itself; the connect request naming an IPv6 destination is unit-tested
//! (`gateway/src/streams/payload.rs`) and the stream between the gateways stays on the nodes' IPv4
//! addresses (the migration's family and the fabric's are independent).

mod common;

use std::time::Duration;

use common::{run, serial};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn ipv6_migration_connections_are_captured_and_carried() {
    let _s = serial();
    // Two published ports on the IPv6 target, a connection to each plus one to a port that
    // is not published (never redirected: it reaches the server from vhA's own address).
    let script = "\
        . $S/topology6.sh\n\
        gw nodeA --peer fd00:2::2=198.18.0.2:7471\n\
        gw nodeB\n\
        ip netns exec vhB $PY $S/hashsrv.py :: 49160 49161 49162 >$T/hs.out &\n\
        for _ in $(seq 100); do grep -q ready $T/hs.out && break; sleep 0.05; done\n\
        m='\"uid\":\"u6\",\"vmi\":\"default/vm6\",\"target\":\"fd00:2::2\",\"ports\":[49160,49161]'\n\
        event nodeB \"{\\\"started\\\":{$m,\\\"role\\\":\\\"target\\\"}}\"\n\
        event nodeA \"{\\\"started\\\":{$m,\\\"role\\\":\\\"source\\\"}}\"\n\
        wait_table vhA\n\
        echo TABLES=$(tables vhA | awk '{print $2}' | sort -u | tr '\\n' ,)\n\
        ip netns exec vhA $PY $S/hashcli.py 4 [fd00:2::2]:49160 [fd00:2::2]:49161 [fd00:2::2]:49162 \
          | tee $T/hc.out\n\
        echo MATCHED=$(sed -n 's/^matched=//p' $T/hc.out)\n\
        echo P0=$(awk '$1==\"[fd00:2::2]:49160\" {print $2}' $T/hc.out)\n\
        echo P1=$(awk '$1==\"[fd00:2::2]:49161\" {print $2}' $T/hc.out)\n\
        echo P2=$(awk '$1==\"[fd00:2::2]:49162\" {print $2}' $T/hc.out)\n\
        echo RDMA_A=$(metric nodeA 'rdma_gw_connections_total{role=\"source\",path=\"rdma\"}')\n\
        echo TCP_A=$(metric nodeA 'rdma_gw_connections_total{role=\"source\",path=\"tcp\"}')\n\
        ended nodeA u6 false\n\
        ended nodeB u6 false\n\
        for _ in $(seq 100); do [ -z \"$(tables vhA)\" ] && break; sleep 0.05; done\n\
        echo LEFT=$(tables vhA | wc -l)\n";
    let run = run(script, LIMIT);
    run.assert_ok();
    assert_eq!(run.value("TABLES").as_deref(), Some("ip6,"), "{run}");
    assert_eq!(run.num("MATCHED"), 3.0, "{run}");
    // Captured connections reach the server from gateway A's node address.
    assert_eq!(run.value("P0").as_deref(), Some("fd00:18::1"), "{run}");
    assert_eq!(run.value("P1").as_deref(), Some("fd00:18::1"), "{run}");
    assert_eq!(
        run.value("P2").as_deref(),
        Some("fd00:1::2"),
        "an unpublished port is never redirected\n{run}"
    );
    assert_eq!(run.num("RDMA_A"), 0.0, "{run}");
    assert_eq!(run.num("TCP_A"), 2.0, "{run}");
    assert_eq!(run.num("LEFT"), 0.0, "rules removed at the end\n{run}");
}

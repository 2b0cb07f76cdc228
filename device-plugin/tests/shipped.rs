//! What ships: the `rdma-device-plugin` binary carries no test double. Its normal and build
//! dependencies hold no test kit (the fixture builder and the fake kubelet are in
//! `rdma-device-plugin-testkit`, a dev-dependency), and its command line offers no test or fake
//! flag.

// Test code: a panic is how a check fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::Read,
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-device-plugin");
/// Generous for `cargo tree --offline` on a busy CI machine; a hang fails instead of stalling.
const LIMIT: Duration = Duration::from_secs(60);

/// Runs `cmd` to completion, or kills it after [`LIMIT`] and fails the test.
fn run(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {what}: {e}"));
    // Drained on their own threads so a full pipe cannot block the child.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {LIMIT:?}: killed");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn no_test_kit_among_the_shipped_dependencies() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    for features in [
        &[][..],
        &["--all-features"][..],
        &["--no-default-features"][..],
    ] {
        let tree = stdout_of(
            Command::new(env!("CARGO"))
                .args(["tree", "--offline", "--manifest-path", manifest])
                .args(["-p", "rdma-device-plugin", "-e", "normal,build"])
                .args(["--prefix", "none"])
                .args(features),
        );
        // The command listed the real graph: the plugin and its kubelet API are in it.
        assert!(
            tree.lines().any(|l| l.starts_with("rdma-kubelet-api ")),
            "{features:?}: {tree}"
        );
        let kits: Vec<&str> = tree.lines().filter(|l| l.contains("testkit")).collect();
        assert!(
            kits.is_empty(),
            "{features:?}: the shipped plugin depends on {kits:?}"
        );
    }
}

/// The `--flags` and `RDMA_DP_` variables a help text mentions.
fn flags_in(help: &str) -> Vec<String> {
    help.split(|c: char| c.is_whitespace() || "`,;()[]<>=".contains(c))
        .filter(|w| w.starts_with("--") || w.starts_with("RDMA_DP_"))
        .map(str::to_string)
        .collect()
}

#[test]
fn no_test_or_fake_flag_on_the_command_line() {
    let top = stdout_of(Command::new(BIN).arg("--help"));
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(
        commands.contains(&"serve".to_string()) && commands.contains(&"discover".to_string()),
        "{commands:?}"
    );
    let mut helps = vec![("rdma-device-plugin".to_string(), top)];
    for c in &commands {
        helps.push((c.clone(), stdout_of(Command::new(BIN).args([c, "--help"]))));
    }
    for (command, help) in &helps {
        let flags = flags_in(help);
        assert!(
            flags.iter().any(|f| f == "--sysfs-root"),
            "{command}: {flags:?}"
        );
        let doubles: Vec<&String> = flags
            .iter()
            .filter(|f| {
                let f = f.to_ascii_lowercase();
                f.contains("test") || f.contains("fake")
            })
            .collect();
        assert!(doubles.is_empty(), "{command} offers {doubles:?}");
    }
}

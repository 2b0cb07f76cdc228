//! Boots a Soft-RoCE guest (or a wire pair) and runs one command in it, by hand:
//!
//! ```sh
//! cargo run -p rdma-streams-softroce --example guest -- [--wire] [--timeout SECS] [--keep] \
//!     -- COMMAND ARGS...
//! ```
//!
//! The command runs after the topology is up, with the `SOFTROCE_*` variables set (in a pair,
//! on both guests: branch on `$SOFTROCE_ROLE`). Prints each guest's console as it comes, then
//! the outcome; exits with the command's status (the first failing one of a pair).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use rdma_streams_softroce::{GuestSpec, Net, Outcome, WireRole, run_pair_with, run_with};

fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
}

fn report(o: &Outcome) -> u8 {
    say(&format!("== {}", o.summary()));
    say(&format!(
        "== stdout of {}:\n{}",
        o.name,
        o.stdout.trim_end()
    ));
    say(&format!(
        "== stderr of {}:\n{}",
        o.name,
        o.stderr.trim_end()
    ));
    match o.exit {
        Some(0) => 0,
        Some(code) => u8::try_from(code).unwrap_or(1),
        None => 1,
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut wire, mut keep, mut timeout) = (false, false, Duration::from_secs(600));
    let mut command = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--wire" => wire = true,
            "--keep" => keep = true,
            "--timeout" => {
                let secs = args.next().and_then(|s| s.parse().ok());
                let Some(secs) = secs else {
                    say("--timeout needs seconds");
                    return ExitCode::from(2);
                };
                timeout = Duration::from_secs(secs);
            }
            "--" => {
                command.extend(args.by_ref());
                break;
            }
            _ => command.push(arg),
        }
    }
    let sink = |guest: &str, line: &str| say(&format!("[{guest}] {line}"));
    let result = if wire {
        let spec = |role: WireRole| {
            GuestSpec::new(role.as_str(), command.clone())
                .net(Net::Wire { role, port: 0 })
                .timeout(timeout)
        };
        run_pair_with(&spec(WireRole::A), &spec(WireRole::B), &sink).map(|(a, b)| {
            let (ra, rb) = (report(&a), report(&b));
            (if ra != 0 { ra } else { rb }, a.shared_dir)
        })
    } else {
        let spec = GuestSpec::new("guest", command).timeout(timeout);
        run_with(&spec, &sink).map(|o| (report(&o), o.shared_dir))
    };
    match result {
        Ok((code, dir)) => {
            if keep || code != 0 {
                say(&format!("== kept {}", dir.display()));
            } else {
                let _ = std::fs::remove_dir_all(&dir);
            }
            ExitCode::from(code)
        }
        Err(e) => {
            say(&format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}

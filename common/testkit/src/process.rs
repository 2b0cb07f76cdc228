//! Running a command to its end under a time limit, its output read as it comes (a chatty
//! command never blocks on a full pipe).

use std::{
    io::Read,
    process::{Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

/// What a finished command printed.
#[derive(Debug)]
pub struct Output {
    /// How it exited.
    pub status: ExitStatus,
    /// Its standard output, lossily decoded.
    pub stdout: String,
    /// Its standard error, lossily decoded.
    pub stderr: String,
}

fn drain(mut r: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = r.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `cmd` (standard input empty) to completion; kills it and panics when it takes longer
/// than `limit`.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
    let out = drain(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {limit:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_larger_than_a_pipe_is_read_whole() {
        let out = run(
            Command::new("sh").args(["-c", "head -c 1000000 /dev/zero; echo oops >&2; exit 3"]),
            Duration::from_secs(30),
        );
        assert_eq!(out.stdout.len(), 1_000_000);
        assert_eq!(out.stderr, "oops\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn a_command_past_its_limit_is_killed() {
        let started = Instant::now();
        let failed = std::panic::catch_unwind(|| {
            run(Command::new("sleep").arg("30"), Duration::from_millis(200))
        });
        assert!(failed.is_err());
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}

//! Exec probes (and exec lifecycle hooks) through CRI `ExecSync`: the
//! command runs in the container; exit code 0 is success, its combined
//! output (at most 10 KiB) is the failure message, and a command that
//! outlives the probe's timeout is a failure "command \"...\" timed out",
//! as upstream's exec prober with ExecProbeTimeout.

use std::time::Duration;

use super::text::quote;
use super::ProbeResult;
use crate::agent::cri::{api, Cri};

/// Upstream reads at most this much of a probe's output.
pub const MAX_OUTPUT: usize = 10 * 1024;

/// How long past the command's own timeout the runtime may take to kill
/// it and answer before the call is abandoned.
const RUNTIME_GRACE: Duration = Duration::from_secs(10);

/// Why a command in a container did not succeed, spelled as upstream's
/// remote runtime client spells it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error("command '{cmd}' exited with {code}: {stderr}")]
    Exited { cmd: String, code: i32, stderr: String },
    #[error("command {} timed out", quote(.cmd))]
    TimedOut { cmd: String },
    #[error("rpc error: code = {code:?} desc = {message}")]
    Runtime { code: tonic::Code, message: String },
}

/// What a command printed (stdout, then stderr) and how it ended.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    pub output: Vec<u8>,
    pub result: Result<(), ExecError>,
}

/// Runs `cmd` in the container and waits for it. `timeout` (whole seconds,
/// at least one) is passed to the runtime, which kills the command when it
/// passes; `None` waits as long as the command runs (lifecycle hooks).
pub async fn exec_sync(cri: &Cri, container_id: &str, cmd: &[String], timeout: Option<Duration>) -> ExecOutcome {
    let joined = cmd.join(" ");
    let secs = timeout.map(|t| t.as_secs().max(1)).unwrap_or(0);
    let req = api::ExecSyncRequest { container_id: container_id.to_string(), cmd: cmd.to_vec(), timeout: secs as i64 };
    let mut runtime = cri.runtime();
    let call = runtime.exec_sync(req);
    let answer = match timeout {
        Some(_) => {
            let limit = Duration::from_secs(secs) + RUNTIME_GRACE;
            match tokio::time::timeout(limit, call).await {
                Ok(answer) => answer,
                Err(_) => return ExecOutcome { output: Vec::new(), result: Err(ExecError::TimedOut { cmd: joined }) },
            }
        }
        None => call.await,
    };
    match answer {
        Ok(resp) => {
            let resp = resp.into_inner();
            let mut output = resp.stdout;
            output.extend_from_slice(&resp.stderr);
            let result = if resp.exit_code == 0 {
                Ok(())
            } else {
                Err(ExecError::Exited {
                    cmd: joined,
                    code: resp.exit_code,
                    stderr: String::from_utf8_lossy(&resp.stderr).into_owned(),
                })
            };
            ExecOutcome { output, result }
        }
        Err(status) if timeout.is_some() && status.code() == tonic::Code::DeadlineExceeded => {
            ExecOutcome { output: Vec::new(), result: Err(ExecError::TimedOut { cmd: joined }) }
        }
        Err(status) => ExecOutcome {
            output: Vec::new(),
            result: Err(ExecError::Runtime { code: status.code(), message: status.message().to_string() }),
        },
    }
}

/// Maps an exec outcome to a probe result as upstream's exec prober does.
pub fn probe_result(outcome: ExecOutcome) -> ProbeResult {
    match outcome.result {
        Ok(()) => ProbeResult::Success,
        Err(ExecError::Exited { .. }) => ProbeResult::Failure(truncated(&outcome.output)),
        Err(e @ ExecError::TimedOut { .. }) => ProbeResult::Failure(e.to_string()),
        Err(e @ ExecError::Runtime { .. }) => ProbeResult::Unknown(e.to_string()),
    }
}

/// One attempt of an exec probe.
pub async fn probe(cri: &Cri, container_id: &str, cmd: &[String], timeout: Duration) -> ProbeResult {
    probe_result(exec_sync(cri, container_id, cmd, Some(timeout)).await)
}

fn truncated(output: &[u8]) -> String {
    let end = output.len().min(MAX_OUTPUT);
    String::from_utf8_lossy(&output[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_upstream() {
        let e = ExecError::Exited { cmd: "sh -c exit 1".into(), code: 1, stderr: String::new() };
        assert_eq!(e.to_string(), "command 'sh -c exit 1' exited with 1: ");
        let e = ExecError::TimedOut { cmd: "sleep 10".into() };
        assert_eq!(e.to_string(), "command \"sleep 10\" timed out");
        let e = ExecError::Runtime { code: tonic::Code::NotFound, message: "no such container".into() };
        assert_eq!(e.to_string(), "rpc error: code = NotFound desc = no such container");
    }

    #[test]
    fn outcomes_map_to_probe_results() {
        let exited = ExecOutcome {
            output: b"out\nerr\n".to_vec(),
            result: Err(ExecError::Exited { cmd: "x".into(), code: 2, stderr: "err\n".into() }),
        };
        assert_eq!(probe_result(exited), ProbeResult::Failure("out\nerr\n".into()));
        let ok = ExecOutcome { output: b"fine".to_vec(), result: Ok(()) };
        assert_eq!(probe_result(ok), ProbeResult::Success);
        let long = ExecOutcome {
            output: vec![b'a'; MAX_OUTPUT + 5],
            result: Err(ExecError::Exited { cmd: "x".into(), code: 1, stderr: String::new() }),
        };
        match probe_result(long) {
            ProbeResult::Failure(m) => assert_eq!(m.len(), MAX_OUTPUT),
            other => panic!("{other:?}"),
        }
        let gone = ExecOutcome {
            output: Vec::new(),
            result: Err(ExecError::Runtime { code: tonic::Code::NotFound, message: "gone".into() }),
        };
        assert!(matches!(probe_result(gone), ProbeResult::Unknown(_)));
    }
}

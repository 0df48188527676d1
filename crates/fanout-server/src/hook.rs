//! A command the relay runs for a path (`[[pattern]] run_on_demand`): `sh -c` with the
//! path's names in its environment, its output logged line by line under the path, stopped
//! (and reaped) when the path no longer wants it.

use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};

pub struct Hook {
    child: tokio::process::Child,
    path: String,
}

impl Hook {
    /// Starts `cmd` for `path` with `env` set.
    pub fn spawn(cmd: &str, path: &str, env: &[(&str, String)]) -> std::io::Result<Hook> {
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        tracing::info!(path, pid = child.id(), "run_on_demand started: {cmd}");
        let out = child.stdout.take().map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        let err = child.stderr.take().map(|e| Box::new(e) as Box<dyn tokio::io::AsyncRead + Send + Unpin>);
        for stream in [out, err].into_iter().flatten() {
            let path = path.to_string();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(path, "run_on_demand: {line}");
                }
            });
        }
        Ok(Hook { child, path: path.to_string() })
    }

    /// Whether the command still runs (its exit, if it ended, is logged).
    pub fn running(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                tracing::warn!(path = self.path, "run_on_demand ended by itself: {status}");
                false
            }
            Err(_) => false,
        }
    }

    /// Stops the command and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
        tracing::info!(path = self.path, "run_on_demand stopped");
    }
}

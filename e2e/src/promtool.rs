//! Prometheus' own tool, for the checks of what the services serve and of the alert rules
//! shipped beside them. Where it is not installed a check is skipped, and fails under CI
//! (`scripts/test` installs it).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// What `promtool` said, or `None` when it is not installed (outside CI).
#[derive(Debug)]
pub struct Said {
    /// Whether it exited 0.
    pub success: bool,
    /// Its standard output and error together.
    pub text: String,
}

/// Runs `promtool args…` in `dir` with `stdin` on its standard input.
pub fn run(args: &[&str], dir: &Path, stdin: &str) -> Option<Said> {
    let child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is not installed, and CI requires its checks"
        );
        eprintln!(
            "promtool is not installed: `promtool {}` skipped",
            args.join(" ")
        );
        return None;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("written to promtool");
    let output = child.wait_with_output().expect("promtool ran");
    Some(Said {
        success: output.status.success(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

/// The metric families a `/metrics` text declares (its `# TYPE` lines).
pub fn families(metrics: &str) -> Vec<String> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

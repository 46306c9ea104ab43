//! `warden logs [-f] [DAEMON]`: the daemons' logs as `warden up` writes them
//! (`<state>/logs/<daemon>.log`), the last lines of each, then with `-f` what is appended, each
//! line tagged with its daemon when more than one log is shown.
//!
//! Must never: write to a log or reach a daemon; it reads files.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

use crate::layout::{DAEMONS_WITH_APPROVER, Layout};

#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("no such daemon {0:?}: policy, approver, supervisor, gateway or up")]
    Unknown(String),
    #[error("no logs in {0} (warden up writes them there; was it started with this --state-dir?)")]
    None(PathBuf),
}

/// One log being shown: its tag, path, and how far it was read.
struct Followed {
    tag: String,
    path: PathBuf,
    offset: u64,
    /// A line not finished yet (the daemon is writing it).
    partial: String,
}

impl Followed {
    /// Prints what was appended since the last read (a truncated file — a new `warden up` —
    /// is read again from its start).
    fn more(&mut self, tagged: bool) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
        }
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if let Ok(n) = f.read_to_end(&mut buf) {
            self.offset += n as u64;
        }
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            print_line(&self.tag, line.trim_end_matches('\n'), tagged);
        }
    }
}

fn print_line(tag: &str, line: &str, tagged: bool) {
    // A log line may carry what an agent wrote; daemons escape it, this keeps it one line.
    if tagged {
        println!("[{tag:>10}] {}", warden_terminal_text::Inline(line));
    } else {
        println!("{}", warden_terminal_text::Inline(line));
    }
}

pub async fn run(
    layout: &Layout,
    daemon: Option<&str>,
    follow: bool,
    lines: usize,
) -> Result<(), LogsError> {
    let names: Vec<&str> = match daemon {
        Some(d) if DAEMONS_WITH_APPROVER.contains(&d) || d == "up" => vec![d],
        Some(d) => {
            let d = d.strip_prefix("warden-").unwrap_or(d);
            if DAEMONS_WITH_APPROVER.contains(&d) {
                vec![d]
            } else {
                return Err(LogsError::Unknown(d.to_string()));
            }
        }
        None => DAEMONS_WITH_APPROVER
            .iter()
            .copied()
            .chain(["up"])
            .collect(),
    };
    let mut shown: Vec<Followed> = names
        .iter()
        .map(|n| Followed {
            tag: n.to_string(),
            path: layout.log_of(n),
            offset: 0,
            partial: String::new(),
        })
        .filter(|f| f.path.is_file() || daemon.is_some())
        .collect();
    if shown.iter().all(|f| !f.path.is_file()) && !follow {
        return Err(LogsError::None(layout.logs_dir()));
    }
    let tagged = shown.len() > 1;
    for f in &mut shown {
        let text = std::fs::read(&f.path).unwrap_or_default();
        f.offset = text.len() as u64;
        let text = String::from_utf8_lossy(&text);
        let all: Vec<&str> = text.lines().collect();
        // A last line without its newline yet is left for --follow to finish.
        let complete = if text.ends_with('\n') {
            all.len()
        } else {
            f.partial = all.last().map(|l| l.to_string()).unwrap_or_default();
            all.len().saturating_sub(1)
        };
        for l in &all[complete.saturating_sub(lines)..complete] {
            print_line(&f.tag, l, tagged);
        }
    }
    if !follow {
        return Ok(());
    }
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for f in &mut shown {
            f.more(tagged);
        }
    }
}

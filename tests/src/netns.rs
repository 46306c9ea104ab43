//! Another "host" on this machine: a network namespace joined to this one by a veth pair, each
//! side with its own address and traffic only over the pair (the issue's "several hosts as
//! network namespaces"). Processes are run in it with `ip netns exec`; they share this machine's
//! filesystem. Removed when dropped.

use std::process::Command;

pub struct Host {
    pub name: String,
    /// This side's end of the pair: down is a partition (no reset, packets just vanish).
    pub link: String,
    /// The host's address, as this side reaches it.
    pub addr: String,
    /// This side's address on the link, as the host reaches it.
    pub local: String,
}

/// Runs `ip` and fails the test on an error.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("ip runs (iproute2)");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Host {
    /// A new host; None (and said) where namespaces cannot be made: not root, outside CI.
    /// `index` is only part of its name (tests number their hosts).
    pub fn new(index: u32) -> Option<Self> {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "network namespaces need root"
            );
            eprintln!("skipped: network namespaces need root");
            return None;
        }
        let pid = std::process::id();
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 32;
        // A /30 per host: distinct within this process (32 made before one comes back) and, by
        // the pid, likely across test processes running at once.
        let n = (pid % 6) * 32 + seq + 20;
        let name = format!("wcell{pid}x{seq}h{index}");
        let link = format!("wg{n}x{}", pid % 1000);
        let inner = format!("wc{n}x{}", pid % 1000);
        ip(&["netns", "add", &name]);
        let host = Host {
            name: name.clone(),
            link: link.clone(),
            addr: format!("10.231.{n}.2"),
            local: format!("10.231.{n}.1"),
        };
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &inner]);
        ip(&["link", "set", &inner, "netns", &name]);
        ip(&["addr", "add", &format!("10.231.{n}.1/30"), "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        for args in [
            vec!["addr", "add", &host.addr, "dev", &inner],
            vec!["link", "set", &inner, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut full = vec!["-n", name.as_str()];
            full.extend(args.iter().map(|s| &**s));
            ip(&full);
        }
        ip(&[
            "-n",
            &name,
            "route",
            "add",
            &format!("10.231.{n}.0/30"),
            "dev",
            &inner,
        ]);
        Some(host)
    }

    /// The link between the hosts goes down (a partition) or up.
    pub fn link(&self, up: bool) {
        ip(&["link", "set", &self.link, if up { "up" } else { "down" }]);
    }

    /// Every process in the host's network namespace.
    pub fn pids(&self) -> Vec<i32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .expect("ip runs");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// kill -9 of every process on the host (the host dying), until none is left.
    pub fn kill_all(&self) {
        for _ in 0..50 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill_all();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

//! `portcullis run --haproxy-master-socket`: driving an HAProxy that something else (systemd,
//! a sidecar) supervises. Portcullis writes the configuration, reloads through the given master
//! CLI, uses the runtime API for what needs no reload, and leaves HAProxy running on exit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

const NS: &str = "ext";

/// An HAProxy in master-worker mode, started the way a service manager would start it.
struct ExternalHaproxy(Child);

impl Drop for ExternalHaproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Service `web` with one endpoint on `port`, routed from ext.example.com.
fn web(port: u16) -> String {
    format!(
        "{}---\n{}---\n{}",
        service(NS, "web", &[]),
        endpoint_slices(NS, "web", &[("0", port, true)]),
        ingress(
            NS,
            "web",
            &[route(Some("ext.example.com"), "/", "Prefix", "web")],
            None,
            &[]
        )
    )
}

#[test]
fn drives_an_haproxy_it_does_not_supervise() {
    let mut h = Harness::new();
    let old = h.echo("old-0");
    h.write("web.yaml", &web(old));
    // The operator's bootstrap configuration: just the runtime API socket Portcullis expects.
    let cfg = h.config_dir().join("haproxy.cfg");
    let placeholder = free_port();
    std::fs::write(
        &cfg,
        format!(
            "global\n  stats socket {}/admin.sock mode 600 level admin\n\
             defaults\n  mode http\n  timeout client 5s\n  timeout server 5s\n  timeout connect 5s\n\
             frontend bootstrap\n  bind 127.0.0.1:{placeholder}\n  http-request return status 503\n",
            h.runtime_dir().display()
        ),
    )
    .unwrap();
    let master = h.runtime_dir().join("master.sock");
    let haproxy = ExternalHaproxy(
        Command::new("haproxy")
            .args(["-W", "-db", "-S"])
            .arg(format!("{},mode,600", master.display()))
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(START_TIMEOUT, "the external HAProxy answers", || {
        h.try_show_proc().is_some_and(|p| !p.workers.is_empty())
    });
    let master_pid = h.show_proc().master_pid;

    h.start(&["--haproxy-master-socket", master.to_str().unwrap()]);
    // Portcullis loaded its configuration with one reload of the external master.
    assert_eq!(h.reloads(), (1, 0));
    h.wait_old_workers_gone();
    assert_eq!(h.who("ext.example.com", "/"), "old-0");

    // An endpoint change goes through the runtime API of the same HAProxy.
    let new = h.echo("new-0");
    h.write("web.yaml", &web(new));
    wait_until(APPLY_TIMEOUT, "the new endpoint answers", || {
        h.who("ext.example.com", "/") == "new-0"
    });
    assert_eq!(h.reloads(), (1, 0));

    // Stopping Portcullis leaves the supervised HAProxy serving.
    let status = h
        .terminate(Duration::from_secs(15))
        .expect("portcullis exits");
    assert!(status.success(), "{status}");
    assert!(process_exists(master_pid));
    assert_eq!(h.who("ext.example.com", "/"), "new-0");
    drop(haproxy);
}

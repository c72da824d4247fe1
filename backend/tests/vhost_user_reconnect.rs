//! Spec §16.5: a frontend that connects again and again does not use up the daemon's file
//! descriptors. Its own test binary: it counts the descriptors of the whole process.

mod vhost_user_support;

use std::os::unix::net::UnixStream;
use std::time::Duration;

use vhost_user_support::no_command_parts;
use vrdma_backend::vhost_user::daemon::listen;
use vrdma_backend::vhost_user::{serve, VirtqOutput};

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Found by the `vhost_user` fuzz target: every connection left its vring worker's exit event
/// open (vhost-user-backend registers it in the worker's epoll and never closes it), one
/// descriptor per connection for the daemon's lifetime.
#[test]
fn connections_leave_no_descriptor_behind() {
    const CONNECTIONS: usize = 20;
    let dir = std::env::temp_dir().join(format!("vrdma-test-reconnect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("vrdma.sock");
    let parts = no_command_parts(VirtqOutput::new(8));
    let mut listener = listen(&path).expect("listen");
    // The first connection sets up whatever the daemon keeps for good; count after it.
    let daemon = std::thread::spawn(move || {
        serve(&mut listener, &parts, Some(CONNECTIONS + 1)).expect("serve");
    });
    let connect_and_hang_up = || {
        let sock = UnixStream::connect(&path).expect("connect");
        std::thread::sleep(Duration::from_millis(20));
        drop(sock);
    };
    connect_and_hang_up();
    std::thread::sleep(Duration::from_millis(200));
    let before = open_descriptors();
    for _ in 0..CONNECTIONS {
        connect_and_hang_up();
    }
    daemon.join().expect("the daemon served every connection");
    let after = open_descriptors();
    // The listener and the first connection's leftovers are gone now, nothing else may stay.
    assert!(
        after <= before,
        "{CONNECTIONS} connections left {} descriptors open",
        after - before
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! Spec §16.5 "Logs": guest-triggered warnings carry the device label and are rate-limited per
//! device. Two devices of one process: one floods its control queue with malformed chains, the
//! other's first malformed chain is still logged, and every line names its device. Its own
//! test binary: it installs a logger that records the lines.

mod log_capture;

mod vhost_user_support;

use std::thread;
use std::time::Duration;

use vrdma_backend::vhost_user::daemon::listen;
use vrdma_backend::vhost_user::{serve, VirtqOutput};
use vrdma_spec::VRDMA_VQ_CONTROL;

use vhost_user_support::*;

/// A device called `label`, served for one connection on a thread.
fn device(label: &str) -> (std::path::PathBuf, thread::JoinHandle<()>) {
    let path = socket_path(label);
    let parts = no_command_parts(VirtqOutput::with_label(8, label));
    let mut listener = listen(&path).unwrap();
    let t = thread::spawn(move || serve(&mut listener, &parts, Some(1)).expect("serve"));
    (path, t)
}

/// Send `n` control chains without a writable part (each one guest-triggered warning) and
/// wait until the device has returned every one.
fn malformed_chains(ring: &mut DriverRing, guest: &mut Guest, n: usize) {
    let buf = guest.alloc(16, 8);
    let mut left = n;
    while left > 0 {
        let batch = left.min(usize::from(ring.size) / 2);
        for _ in 0..batch {
            ring.add(guest, &[(buf, 16, false)]);
        }
        ring.notify();
        for _ in 0..batch {
            let (_, len) = ring
                .wait_used(guest, Duration::from_secs(5))
                .expect("the malformed chain is returned");
            assert_eq!(len, 0);
        }
        left -= batch;
    }
}

fn lines_of(label: &str) -> usize {
    let prefix = format!("{label}: ");
    log_capture::lines()
        .iter()
        .filter(|l| l.starts_with(&prefix) && l.contains("writable bytes"))
        .count()
}

#[test]
fn a_flooding_device_does_not_silence_another_devices_first_warning() {
    log_capture::install();
    let (path_a, ta) = device("tenant-a");
    let (path_b, tb) = device("tenant-b");

    let (mut fe_a, _) = connect(&path_a, true);
    let mut guest_a = Guest::new(0x10_0000, 1 << 20);
    let [mut ring_a] = start_queues(&mut fe_a, &mut guest_a, [VRDMA_VQ_CONTROL], 64);
    malformed_chains(&mut ring_a, &mut guest_a, 200);
    // The flood: the first 16 of 200 are logged, each naming the device.
    assert_eq!(lines_of("tenant-a"), 16);

    let (mut fe_b, _) = connect(&path_b, true);
    let mut guest_b = Guest::new(0x10_0000, 1 << 20);
    let [mut ring_b] = start_queues(&mut fe_b, &mut guest_b, [VRDMA_VQ_CONTROL], 64);
    malformed_chains(&mut ring_b, &mut guest_b, 1);
    assert_eq!(
        lines_of("tenant-b"),
        1,
        "tenant-b's first warning: {:?}",
        log_capture::lines()
    );
    // Every guest-triggered line of the run names one of the devices.
    for l in log_capture::lines().iter() {
        assert!(
            l.starts_with("tenant-a: ") || l.starts_with("tenant-b: "),
            "unlabelled: {l}"
        );
    }
    drop(fe_a);
    drop(fe_b);
    ta.join().unwrap();
    tb.join().unwrap();
}

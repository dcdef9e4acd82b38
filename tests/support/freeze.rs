//! Stops chosen threads of another process while the rest of it runs: a fault that
//! `kill -STOP` cannot make, since a signal stops every thread of a process at once.
//!
//! The threads are stopped with ptrace (`PTRACE_SEIZE`, then `PTRACE_INTERRUPT`), which
//! needs `CAP_SYS_PTRACE` or a Yama `ptrace_scope` of 0 (root on the CI machines has the
//! capability). ptrace requests must come from the thread that attached, so one
//! std thread attaches, waits to be told to let go, and detaches; the kernel detaches by
//! itself if that thread dies, so even an aborted test leaves no thread stopped.

use std::sync::mpsc;
use std::thread::JoinHandle;

/// Threads of one process, stopped until this is dropped.
pub struct Frozen {
    /// The thread ids that were stopped.
    pub tids: Vec<i32>,
    release: Option<mpsc::Sender<()>>,
    tracer: Option<JoinHandle<()>>,
}

/// The ids and names (`/proc/PID/task/TID/comm`, at most 15 bytes) of a process's threads.
pub fn threads(pid: i32) -> Vec<(i32, String)> {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|entry| {
            let tid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("{dir}/{tid}/comm")).ok()?;
            Some((tid, comm.trim_end().to_owned()))
        })
        .collect()
}

/// Stops every thread of `pid` whose name `matches`; fails the test if none does or one
/// cannot be stopped (and says why).
pub fn freeze(pid: i32, matches: impl Fn(&str) -> bool) -> Frozen {
    let named = threads(pid);
    let tids: Vec<i32> = named
        .iter()
        .filter(|(_, name)| matches(name))
        .map(|(tid, _)| *tid)
        .collect();
    assert!(
        !tids.is_empty(),
        "no thread of {pid} matches; its threads: {:?}",
        named.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>()
    );
    let (stopped_tx, stopped) = mpsc::channel::<Result<(), String>>();
    let (release, released) = mpsc::channel::<()>();
    let to_stop = tids.clone();
    let tracer = std::thread::spawn(move || {
        let result = to_stop.iter().try_for_each(|&tid| stop(tid));
        let ok = result.is_ok();
        let _ = stopped_tx.send(result);
        if ok {
            // Until told to, or until the Frozen is gone.
            let _ = released.recv();
        }
        for &tid in &to_stop {
            // SAFETY: a plain ptrace request on a thread this thread attached; it fails
            // harmlessly (ESRCH) for one that was never attached or has exited.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
        }
    });
    if let Err(why) = stopped.recv().expect("the tracer thread answers") {
        let _ = tracer.join();
        panic!("stopping threads {tids:?} of {pid}: {why}");
    }
    Frozen {
        tids,
        release: Some(release),
        tracer: Some(tracer),
    }
}

/// Attaches to `tid` and stops it; returns once it is stopped.
fn stop(tid: i32) -> Result<(), String> {
    let os_error = |what: &str| format!("{what} {tid}: {}", std::io::Error::last_os_error());
    // SAFETY: ptrace requests with no memory passed (addr and data are 0).
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
        return Err(os_error(
            "PTRACE_SEIZE (needs CAP_SYS_PTRACE or ptrace_scope 0)",
        ));
    }
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) } != 0 {
        return Err(os_error("PTRACE_INTERRUPT"));
    }
    let mut status = 0;
    // SAFETY: waits for the tracee's stop; `status` is a valid out-pointer.
    if unsafe { libc::waitpid(tid, &mut status, libc::__WALL) } != tid {
        return Err(os_error("waitpid"));
    }
    Ok(())
}

impl Frozen {
    /// Lets the threads run again (as dropping does).
    pub fn thaw(mut self) {
        self.release_now();
    }

    fn release_now(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        if let Some(tracer) = self.tracer.take() {
            let _ = tracer.join();
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.release_now();
    }
}

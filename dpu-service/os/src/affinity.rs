//! CPU affinity for data-plane workers and NVMe/TCP queue threads: pin a
//! thread to one CPU, hold it to a set, read a thread's set back (its own,
//! or another thread's by name, from `/proc`).

use std::io;
use std::mem::size_of;

use crate::sys::{cvt, invalid};

/// Pins the calling thread to CPU `cpu`.
///
/// # Errors
/// If the CPU does not exist or is outside the process's allowed set
/// (e.g. a container's cpuset).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    set_affinity(&[cpu]).map_err(|e| io::Error::new(e.kind(), format!("pinning to CPU {cpu}: {e}")))
}

/// Lets the calling thread run on the CPUs `cpus` only (any of them, as
/// the scheduler sees fit); threads it spawns later inherit the set.
///
/// # Errors
/// If `cpus` is empty, or none of its CPUs is in the process's allowed set
/// (the kernel then refuses the whole set), or one is beyond
/// `CPU_SETSIZE`.
pub fn set_current_thread_cpus(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(invalid("an empty CPU set"));
    }
    set_affinity(cpus)
        .map_err(|e| io::Error::new(e.kind(), format!("restricting to CPUs {cpus:?}: {e}")))
}

/// `sched_setaffinity` of the calling thread to exactly `cpus`.
fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is a bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(invalid(&format!(
                "CPU {cpu} is beyond CPU_SETSIZE ({})",
                libc::CPU_SETSIZE
            )));
        }
        // SAFETY: cpu < CPU_SETSIZE (checked above), so the bit is in `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    cvt(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) }).map(drop)
}

/// The CPUs the calling thread may run on.
///
/// # Errors
/// If the kernel refuses the query.
pub fn current_thread_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed cpu_set_t of the size
    // passed; pid 0 is the calling thread.
    cvt(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE, inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Parses a CPU list as Linux writes them ("0-3,6"); `None` if it is
/// not one.
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// The CPUs each thread of this process named `name` may run on, as the
/// kernel reports them (`Cpus_allowed_list` in `/proc/self/task/*/status`):
/// how a placement can be checked from outside the threads.
///
/// # Errors
/// If the task list cannot be read, or a thread's CPU list is not one.
pub fn thread_cpus_by_name(name: &str) -> io::Result<Vec<Vec<usize>>> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")? {
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(str::trim)
                .unwrap_or_default()
        };
        if field("Name:") == name {
            let list = field("Cpus_allowed_list:");
            found.push(parse_cpu_list(list).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("CPU list {list:?}"))
            })?);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_linux_writes_them() {
        assert_eq!(parse_cpu_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("1"), Some(vec![1]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn this_threads_cpus_are_found_by_its_name() {
        let me = std::thread::Builder::new()
            .name("cpus-by-name".into())
            .spawn(|| {
                let mine = current_thread_cpus().unwrap();
                (mine, thread_cpus_by_name("cpus-by-name").unwrap())
            })
            .unwrap();
        let (mine, found) = me.join().unwrap();
        assert_eq!(found, [mine]);
        assert!(thread_cpus_by_name("no-such-thread").unwrap().is_empty());
    }

    #[test]
    fn pinning_moves_the_thread_and_stays_within_the_allowed_set() {
        let allowed = current_thread_cpus().unwrap();
        let &last = allowed.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            assert_eq!(current_thread_cpus().unwrap(), vec![last]);
        })
        .join()
        .unwrap();
        assert!(pin_current_thread(libc::CPU_SETSIZE as usize).is_err());
    }

    #[test]
    fn a_thread_can_be_held_to_a_set_of_cpus_and_its_children_inherit_it() {
        let allowed = current_thread_cpus().unwrap();
        // Every CPU but the first, where there are two or more.
        let some: Vec<usize> = if allowed.len() > 1 {
            allowed[1..].to_vec()
        } else {
            allowed.clone()
        };
        let want = some.clone();
        std::thread::spawn(move || {
            set_current_thread_cpus(&some).unwrap();
            assert_eq!(current_thread_cpus().unwrap(), some);
            let child = std::thread::spawn(current_thread_cpus).join().unwrap();
            assert_eq!(child.unwrap(), want);
            // Back to the whole set: a thread may widen its set again.
            set_current_thread_cpus(&allowed).unwrap();
            assert_eq!(current_thread_cpus().unwrap(), allowed);
        })
        .join()
        .unwrap();
        assert!(set_current_thread_cpus(&[]).is_err());
        assert!(set_current_thread_cpus(&[0, libc::CPU_SETSIZE as usize]).is_err());
    }
}

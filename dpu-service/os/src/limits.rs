//! Process resource limits: the daemon raises its open-file limit at
//! start, since every NVMe/TCP connection holds a descriptor and the
//! usual soft limit (1,024) is far below `storage.max_connections`.

use std::io;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The open-file limit before and after [`raise_open_files`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// Soft limit found at start (`None`: unlimited).
    pub before: Option<u64>,
    /// Soft limit now: the hard limit, if raising it worked.
    pub now: Option<u64>,
}

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard
/// limit, as servers holding many sockets do; the hard limit is the
/// administrator's (or the container runtime's) and stays.
pub fn raise_open_files() -> io::Result<OpenFiles> {
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current;
    if before.is_none() || before == limit.maximum {
        return Ok(OpenFiles {
            before,
            now: before,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    )
    .map_err(io::Error::from)?;
    Ok(OpenFiles {
        before,
        now: getrlimit(Resource::Nofile).current,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_reaches_the_hard_one() {
        let hard = getrlimit(Resource::Nofile).maximum;
        let r = raise_open_files().unwrap();
        assert_eq!(r.now, hard);
        assert_eq!(getrlimit(Resource::Nofile).current, hard);
        // A second call finds nothing to raise.
        assert_eq!(raise_open_files().unwrap().before, hard);
    }
}

//! `--enable-profiling`: upstream serves Go's pprof on the admin port; tether serves the
//! same paths with what a Rust process can offer.
//!
//! - `/debug/pprof/profile?seconds=N` (default 30): a CPU profile of the whole process,
//!   sampled at 100 Hz by the `pprof` crate and encoded as pprof's protobuf (uncompressed),
//!   which `go tool pprof` reads as it reads Go's.
//! - `/debug/pprof/heap`: heap statistics as text (glibc's `mallinfo2` and the kernel's view).
//! - `/debug/pprof/`: an index of the two.
//!
//! Off by default, as upstream: without the flag these paths are not routed at all (404).
//!
//! Beside them, always on, [`trim`]: the allocator maintenance that gives freed heap back
//! after load, next to the allocator statistics it reads.

mod cpu;
mod heap;
mod profile_proto;
pub mod trim;

use std::time::Duration;

pub use cpu::{ProfileError, profile};
pub use heap::statistics as heap_statistics;
use tether_observe::http::{Deferred, DeferredHandler, Request, Response};

/// Go's default profile length.
const DEFAULT_SECONDS: u64 = 30;
/// Longest profile served: past this an operator wants a continuous profiler.
const MAX_SECONDS: u64 = 300;

const INDEX: &str = "tether profiling (--enable-profiling)\n\n\
/debug/pprof/profile?seconds=N  CPU profile, pprof protobuf (go tool pprof URL)\n\
/debug/pprof/heap               heap statistics (glibc mallinfo2, /proc/self/status)\n";

/// The profiling routes, for [`tether_observe::http::serve_with`].
pub fn handler() -> DeferredHandler {
    DeferredHandler::new(|req: &Request| -> Option<Deferred> {
        match req.path.as_str() {
            "/debug/pprof" | "/debug/pprof/" => {
                Some(Box::pin(async { Response::text(200, INDEX) }))
            }
            "/debug/pprof/heap" => {
                Some(Box::pin(async { Response::text(200, heap::statistics()) }))
            }
            "/debug/pprof/profile" => {
                let seconds = seconds(req.query.as_deref());
                Some(Box::pin(async move {
                    match seconds {
                        Ok(seconds) => cpu_profile(Duration::from_secs(seconds)).await,
                        Err(message) => Response::text(400, message),
                    }
                }))
            }
            _ => None,
        }
    })
}

async fn cpu_profile(period: Duration) -> Response {
    let taken = tokio::task::spawn_blocking(move || profile(period)).await;
    match taken {
        Ok(Ok(body)) => {
            let mut response = Response::bytes(200, "application/octet-stream", body);
            response.headers.push((
                "Content-Disposition".to_owned(),
                "attachment; filename=\"profile\"".to_owned(),
            ));
            response
        }
        Ok(Err(ProfileError::Busy)) => {
            Response::text(409, "a CPU profile is already being taken\n")
        }
        Ok(Err(ProfileError::Failed(e))) => {
            tracing::warn!(error = %e, "CPU profile failed");
            Response::text(500, format!("CPU profile failed: {e}\n"))
        }
        Err(e) => Response::text(500, format!("CPU profile failed: {e}\n")),
    }
}

/// `seconds=N` from the query: 1 to [`MAX_SECONDS`], [`DEFAULT_SECONDS`] when absent.
fn seconds(query: Option<&str>) -> Result<u64, String> {
    let Some(value) = query
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("seconds="))
    else {
        return Ok(DEFAULT_SECONDS);
    };
    match value.parse::<u64>() {
        Ok(n @ 1..=MAX_SECONDS) => Ok(n),
        _ => Err(format!(
            "seconds must be a whole number from 1 to {MAX_SECONDS}, not {value:?}\n"
        )),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn seconds_parameter() {
        assert_eq!(seconds(None), Ok(30));
        assert_eq!(seconds(Some("seconds=5")), Ok(5));
        assert_eq!(seconds(Some("debug=1&seconds=2")), Ok(2));
        assert!(seconds(Some("seconds=0")).is_err());
        assert!(seconds(Some("seconds=301")).is_err());
        assert!(seconds(Some("seconds=x")).is_err());
    }

    /// This process's CPU time (user and system, all threads) from /proc, in seconds. Its
    /// clock ticks are USER_HZ, 100 a second on Linux whatever the kernel's HZ.
    fn cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
        // The fields after the command name, which is parenthesised and may hold spaces.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks = |i: usize| fields[i].parse::<u64>().expect("a tick count");
        // utime and stime are fields 14 and 15 of stat(5); the slice starts at field 3.
        (ticks(11) + ticks(12)) as f64 / 100.0
    }

    /// Busy work the profiler must see.
    fn spin(until: tokio::time::Instant) -> u64 {
        let mut x = 1u64;
        while tokio::time::Instant::now() < until {
            for i in 0..10_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
        }
        x
    }

    #[test]
    fn a_profile_decodes_and_has_samples_with_names() {
        let until = tokio::time::Instant::now() + Duration::from_millis(1500);
        let worker = std::thread::spawn(move || spin(until));
        let cpu_before = cpu_seconds();
        let bytes = profile(Duration::from_secs(1)).expect("profile");
        let cpu = cpu_seconds() - cpu_before;
        worker.join().unwrap();
        let decoded = profile_proto::Profile::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(decoded.string_table[0], "");
        assert_eq!(decoded.sample_type.len(), 2);
        assert!(!decoded.sample.is_empty(), "a busy second has samples");
        let total: i64 = decoded.sample.iter().map(|s| s.value[0]).sum();
        // The profiler samples CPU time, 100 times a CPU second; on a loaded machine the
        // worker gets less than the wall-clock second, so expect a share of what it got.
        let expected = cpu * 100.0;
        assert!(
            total as f64 >= expected / 4.0,
            "about 100 samples per CPU second: {cpu:.2} s of CPU, {total} samples"
        );
        assert!(
            decoded.string_table.iter().any(|s| s.contains("spin")),
            "the busy function is named"
        );
        for s in &decoded.sample {
            for id in &s.location_id {
                assert!(decoded.location.iter().any(|l| l.id == *id));
            }
        }
    }
}

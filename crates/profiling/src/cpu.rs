//! CPU profiles: pprof-rs samples every thread's stack on `SIGPROF` for the requested
//! period; the samples are then symbolized and encoded as pprof's protobuf.
//!
//! Symbolizing parses the binary's DWARF line tables, which the `backtrace` crate keeps
//! cached for the life of the process: one profile of the server left about 240 MB resident.
//! The cache is cleared and the freed heap given back after every profile, so a profile
//! costs that memory only while it is built (the next one parses again, in well under a
//! second).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use prost::Message as _;

use crate::profile_proto::{Function, Label, Line, Location, Profile, Sample, ValueType};

/// Samples per second, as Go's `runtime/pprof` takes them.
const FREQUENCY: i32 = 100;
/// Frames from the unwinder and the C library are noise in every stack.
const BLOCKLIST: &[&str] = &["libc", "libgcc", "pthread", "vdso"];

/// One profile at a time: the sampling timer and signal handler are process-wide.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Why no profile was produced.
#[derive(Debug)]
pub enum ProfileError {
    /// Another profile is being taken.
    Busy,
    Failed(String),
}

/// Profiles the whole process for `period`, blocking the calling thread meanwhile (run it
/// on a blocking thread). Returns the encoded `profile.proto`.
pub fn profile(period: Duration) -> Result<Vec<u8>, ProfileError> {
    if RUNNING.swap(true, Ordering::AcqRel) {
        return Err(ProfileError::Busy);
    }
    let result = sample(period);
    RUNNING.store(false, Ordering::Release);
    result
}

fn sample(period: Duration) -> Result<Vec<u8>, ProfileError> {
    let failed = |e: pprof::Error| ProfileError::Failed(e.to_string());
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(BLOCKLIST)
        .build()
        .map_err(failed)?;
    std::thread::sleep(period);
    let report = guard.report().build();
    drop(guard);
    backtrace::clear_symbol_cache();
    let encoded = report.map(|report| encode(&report).encode_to_vec());
    crate::trim::give_back();
    encoded.map_err(failed)
}

/// Interns strings: the format refers to every string by its index.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut strings = Self::default();
        strings.get("");
        strings
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Converts pprof-rs's report: one location per program counter (its inlined calls as
/// lines), one function per name and file, two values per sample (count and CPU time).
fn encode(report: &pprof::Report) -> Profile {
    let mut strings = Strings::new();
    let mut functions: HashMap<(String, String), u64> = HashMap::new();
    let mut function_table = Vec::new();
    let mut locations: HashMap<Vec<(u64, i64)>, u64> = HashMap::new();
    let mut location_table = Vec::new();
    let nanos_per_sample = 1_000_000_000 / i64::from(report.timing.frequency.max(1));
    let thread = strings.get("thread");
    let mut samples = Vec::new();
    for (frames, count) in &report.data {
        let mut stack = Vec::with_capacity(frames.frames.len());
        for frame in &frames.frames {
            let lines: Vec<(u64, i64)> = frame
                .iter()
                .map(|symbol| {
                    let name = symbol.name();
                    let file = symbol.filename().into_owned();
                    let key = (name, file);
                    let id = match functions.get(&key) {
                        Some(&id) => id,
                        None => {
                            let id = function_table.len() as u64 + 1;
                            function_table.push(Function {
                                id,
                                name: strings.get(&key.0),
                                system_name: strings.get(&symbol.sys_name()),
                                filename: strings.get(&key.1),
                            });
                            functions.insert(key, id);
                            id
                        }
                    };
                    (id, i64::from(symbol.lineno()))
                })
                .collect();
            if lines.is_empty() {
                continue;
            }
            let address = frame
                .first()
                .and_then(|s| s.addr)
                .map_or(0, |a| a as usize as u64);
            let id = match locations.get(&lines) {
                Some(&id) => id,
                None => {
                    let id = location_table.len() as u64 + 1;
                    location_table.push(Location {
                        id,
                        address,
                        line: lines
                            .iter()
                            .map(|&(function_id, line)| Line { function_id, line })
                            .collect(),
                    });
                    locations.insert(lines, id);
                    id
                }
            };
            stack.push(id);
        }
        let count = *count as i64;
        samples.push(Sample {
            location_id: stack,
            value: vec![count, count * nanos_per_sample],
            label: vec![Label {
                key: thread,
                str: strings.get(&frames.thread_name_or_id()),
            }],
        });
    }
    let samples_type = ValueType {
        r#type: strings.get("samples"),
        unit: strings.get("count"),
    };
    let cpu_type = ValueType {
        r#type: strings.get("cpu"),
        unit: strings.get("nanoseconds"),
    };
    Profile {
        sample_type: vec![samples_type, cpu_type.clone()],
        sample: samples,
        location: location_table,
        function: function_table,
        string_table: strings.table,
        time_nanos: report
            .timing
            .start_time
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i64,
        duration_nanos: report.timing.duration.as_nanos() as i64,
        period_type: Some(cpu_type),
        period: nanos_per_sample,
    }
}

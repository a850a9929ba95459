//! Replays the saved fuzz inputs under `fuzz/regressions/<target>/` on the stable toolchain,
//! through the same checks the fuzz targets run.

use std::path::Path;

#[test]
fn saved_fuzz_inputs_still_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions");
    let mut replayed = 0;
    for (target, check) in tether_fuzz_checks::TARGETS {
        let dir = root.join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut inputs = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target}: {} fails", path.display());
            inputs += 1;
        }
        assert!(inputs > 0, "{target}: no saved inputs in {}", dir.display());
        replayed += inputs;
    }
    println!("replayed {replayed} saved fuzz inputs");
}

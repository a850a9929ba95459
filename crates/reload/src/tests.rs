use std::os::unix::fs::symlink;

use tether_observe::metrics::Registry;

use super::*;

/// A config of lines, each `key=value`; anything else is refused with its line number.
fn parse_lines(path: &Path, bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            line.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("{}:{}: want key=value", path.display(), i + 1))
        })
        .collect()
}

fn reloader(path: &Path, registry: &Registry) -> Reloader<Vec<(String, String)>> {
    Reloader::load(
        path.to_owned(),
        Box::new(parse_lines),
        ReloadMetrics::register(registry, "test"),
    )
    .unwrap()
}

fn metrics_text(registry: &Registry) -> String {
    registry.render()
}

#[test]
fn a_changed_file_is_the_next_generation_and_the_same_bytes_are_no_change() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    std::fs::write(&path, "a=1\n").unwrap();
    let registry = Registry::default();
    let r = reloader(&path, &registry);
    let first = r.current();
    assert_eq!(first.generation, 1);
    assert_eq!(first.sha256, sha256_hex(b"a=1\n"));
    assert_eq!(r.check(), Outcome::Unchanged);

    std::fs::write(&path, "a=2\n").unwrap();
    assert_eq!(r.check(), Outcome::Applied { generation: 2 });
    assert_eq!(r.current().config[0].1, "2");
    assert_eq!(r.check(), Outcome::Unchanged);

    let text = metrics_text(&registry);
    let file = path.display().to_string();
    assert!(
        text.contains(&format!(
            "test_config_reloads_total{{file=\"{file}\",result=\"applied\"}} 1"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("test_config_generation{{file=\"{file}\"}} 2")));
    // Only the content in force has an info series.
    assert!(text.contains(&sha256_hex(b"a=2\n")));
    assert!(!text.contains(&sha256_hex(b"a=1\n")));
}

#[test]
fn a_bad_file_changes_nothing_and_is_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    std::fs::write(&path, "a=1\n").unwrap();
    let registry = Registry::default();
    let r = reloader(&path, &registry);
    let follow = r.subscribe();

    std::fs::write(&path, "a=1\nbroken\n").unwrap();
    let Outcome::Refused { message } = r.check() else {
        panic!("a bad file was not refused");
    };
    assert!(message.ends_with(":2: want key=value"), "{message}");
    // The same bad bytes again are not refused (and logged) twice.
    assert_eq!(r.check(), Outcome::Unchanged);
    assert_eq!(r.current().generation, 1);
    assert!(
        !follow.has_changed().unwrap(),
        "a refused file was published"
    );
    let refusal = r.last_refusal().expect("the refusal is kept for the views");
    assert_eq!(refusal.sha256, sha256_hex(b"a=1\nbroken\n"));

    // Reverted to the content in force, then the same mistake again: refused again (the
    // soak found this one counted and logged nothing the second time).
    std::fs::write(&path, "a=1\n").unwrap();
    assert_eq!(r.check(), Outcome::Unchanged);
    std::fs::write(&path, "a=1\nbroken\n").unwrap();
    assert!(matches!(r.check(), Outcome::Refused { .. }));
    assert_eq!(r.check(), Outcome::Unchanged);

    std::fs::remove_file(&path).unwrap();
    assert!(matches!(r.check(), Outcome::Refused { message } if message.contains("cannot read")));
    let text = metrics_text(&registry);
    assert!(
        text.contains(&format!(
            "test_config_reloads_total{{file=\"{}\",result=\"refused\"}} 3",
            path.display()
        )),
        "{text}"
    );

    // Fixed: applied, and the refusal is history.
    std::fs::write(&path, "a=3\n").unwrap();
    assert_eq!(r.check(), Outcome::Applied { generation: 2 });
    assert!(follow.has_changed().unwrap());
    assert!(r.last_refusal().is_none());
}

/// Kubernetes' atomic writer: `config` -> `..data/config`, `..data` -> a timestamped
/// directory, and an update swaps `..data` by renaming a new symlink over it.
#[test]
fn a_configmap_style_data_symlink_swap_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("..2026_12_04_01");
    let new = dir.path().join("..2026_12_04_02");
    std::fs::create_dir(&old).unwrap();
    std::fs::create_dir(&new).unwrap();
    std::fs::write(old.join("config"), "a=1\n").unwrap();
    std::fs::write(new.join("config"), "a=2\n").unwrap();
    symlink("..2026_12_04_01", dir.path().join("..data")).unwrap();
    symlink("..data/config", dir.path().join("config")).unwrap();
    let registry = Registry::default();
    let r = reloader(&dir.path().join("config"), &registry);

    symlink("..2026_12_04_02", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    std::fs::remove_dir_all(&old).unwrap();
    assert_eq!(r.check(), Outcome::Applied { generation: 2 });
    assert_eq!(r.current().config[0].1, "2");
}

#[tokio::test]
async fn run_reads_the_file_every_interval_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    std::fs::write(&path, "a=1\n").unwrap();
    let registry = Registry::default();
    let r = Arc::new(reloader(&path, &registry));
    let mut follow = r.subscribe();
    let stop = CancellationToken::new();
    let task = tokio::spawn(r.clone().run(Duration::from_millis(50), stop.clone()));

    // An editor's way: a new file renamed over the old.
    std::fs::write(dir.path().join(".config.swp"), "a=2\n").unwrap();
    std::fs::rename(dir.path().join(".config.swp"), &path).unwrap();
    tokio::time::timeout(Duration::from_secs(5), follow.changed())
        .await
        .expect("applied within a few intervals")
        .unwrap();
    assert_eq!(follow.borrow().generation, 2);

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("run stops when told")
        .unwrap();
}

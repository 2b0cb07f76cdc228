//! [`WatchedFile`] over a trivial [`Watchable`]: edits in place and ConfigMap symlink swaps are
//! published, a bad edit or a deleted file keeps the last good value, polling covers what
//! notify cannot watch, and only relevant events trigger a read.

use std::os::unix::fs::symlink;

use rdma_streams_testkit::within_async;

use super::*;

/// Long enough that only events can explain a reload.
const NO_POLL: Duration = Duration::from_secs(3600);
/// What any reload may take at most.
const LIMIT: Duration = Duration::from_secs(5);

/// A trivial watchable: the file's trimmed text, which must not be "bad".
#[derive(Clone, Debug, PartialEq)]
struct Word(String);

/// Word's error: a message, and the I/O error when the file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct WordError {
    message: String,
    #[source]
    source: Option<std::io::Error>,
}

impl Watchable for Word {
    type Error = WordError;
    fn parse(text: &str, origin: &str) -> Result<Self, WordError> {
        match text.trim() {
            "bad" => Err(WordError {
                message: format!("{origin}: bad word"),
                source: None,
            }),
            w => Ok(Word(w.to_string())),
        }
    }
    fn fallback() -> Self {
        Word("default".into())
    }
    fn read_error(path: PathBuf, source: std::io::Error) -> WordError {
        WordError {
            message: format!("cannot read {}", path.display()),
            source: Some(source),
        }
    }
    fn summary(&self) -> String {
        self.0.clone()
    }
}

#[tokio::test]
async fn generic_watch_keeps_last_good() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    let w: WatchedFile<Word> = spawn(Some(path.clone()), Duration::from_millis(50)).expect("spawn");
    assert_eq!(w.current().0, "default");
    let mut rx = w.subscribe();
    std::fs::write(&path, "one").expect("write");
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("timely")
        .expect("open");
    assert_eq!(w.current().0, "one");
    std::fs::write(&path, "bad").expect("write");
    tokio::time::timeout(Duration::from_secs(5), async {
        while w.reload_failures() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("failure counted");
    assert_eq!(w.current().0, "one");
    assert!(spawn::<Word>(None, Duration::from_secs(1)).is_ok());
    std::fs::write(&path, "bad").expect("write");
    assert!(spawn::<Word>(Some(path), Duration::from_secs(1)).is_err());
}

#[tokio::test]
async fn a_read_error_is_recorded_with_its_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    let w: WatchedFile<Word> = spawn(Some(path.clone()), Duration::from_millis(50)).expect("spawn");
    std::fs::create_dir(&path).expect("mkdir");
    tokio::time::timeout(Duration::from_secs(5), async {
        while w.reload_failures() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("failure counted");
    assert_eq!(
        w.stats().last_error().expect("recorded"),
        format!(
            "cannot read {}: Is a directory (os error 21)",
            path.display()
        )
    );
}

#[test]
fn relevant_events() {
    use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};
    let name = OsStr::new("config.yaml");
    let ev = |kind, path: &str| notify::Event::new(kind).add_path(PathBuf::from(path));
    assert!(is_relevant(
        &ev(EventKind::Modify(ModifyKind::Any), "/c/config.yaml"),
        name
    ));
    assert!(is_relevant(
        &ev(
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            "/c/config.yaml"
        ),
        name
    ));
    assert!(is_relevant(
        &ev(EventKind::Create(CreateKind::Any), "/c/..data_tmp"),
        name
    ));
    assert!(is_relevant(
        &ev(
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            "/c/..data"
        ),
        name
    ));
    assert!(is_relevant(
        &ev(EventKind::Remove(RemoveKind::Any), "/c/config.yaml"),
        name
    ));
    assert!(is_relevant(&notify::Event::new(EventKind::Any), name));
    assert!(!is_relevant(
        &ev(
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            "/c/config.yaml"
        ),
        name
    ));
    assert!(!is_relevant(
        &ev(EventKind::Modify(ModifyKind::Any), "/c/other.yaml"),
        name
    ));
}

/// Polls `cond` until it holds, within [`LIMIT`].
async fn eventually(mut cond: impl FnMut() -> bool) {
    within_async(LIMIT, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The next published word.
async fn next_word(rx: &mut watch::Receiver<Arc<Word>>) -> String {
    within_async(LIMIT, rx.changed())
        .await
        .expect("sender alive");
    rx.borrow_and_update().0.clone()
}

/// `path` holding `text`, watched by events only.
fn watched(path: &Path, text: &str) -> WatchedFile<Word> {
    std::fs::write(path, text).expect("write");
    spawn(Some(path.to_path_buf()), NO_POLL).expect("spawn")
}

#[tokio::test]
async fn edit_in_place_is_published() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    let w = watched(&path, "a");
    let mut rx = w.subscribe();
    assert_eq!(w.current().0, "a");

    std::fs::write(&path, "b").expect("write");
    assert_eq!(next_word(&mut rx).await, "b");
    assert_eq!((w.reloads(), w.reload_failures()), (1, 0));

    // Our own reads (opens) must not trigger further reads.
    let checks = w.stats().checks();
    tokio::time::sleep(DEFAULT_DEBOUNCE * 3).await;
    assert_eq!(w.stats().checks(), checks);
}

#[tokio::test]
async fn bad_edit_keeps_last_good_then_good_edit_is_published() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    let w = watched(&path, "a");
    let mut rx = w.subscribe();

    std::fs::write(&path, "bad").expect("write");
    eventually(|| w.reload_failures() >= 1).await;
    assert!(!rx.has_changed().expect("sender alive"));
    assert_eq!(w.current().0, "a");
    let last_error = w.stats().last_error().expect("an error is recorded");
    assert!(last_error.contains("bad word"), "{last_error}");

    std::fs::write(&path, "c").expect("write");
    assert_eq!(next_word(&mut rx).await, "c");
    assert_eq!(w.reloads(), 1);
    assert_eq!(w.stats().last_error(), None);
}

#[tokio::test]
async fn same_value_publishes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    let w = watched(&path, "a");
    let rx = w.subscribe();
    let checks = w.stats().checks();

    // Different text, same value.
    std::fs::write(&path, "  a\n").expect("write");
    eventually(|| w.stats().checks() > checks).await;
    assert!(!rx.has_changed().expect("sender alive"));
    assert_eq!((w.reloads(), w.reload_failures()), (0, 0));
}

/// Writes `..<ts>/word` and points `..data` at it the way kubelet does.
fn configmap_update(dir: &Path, ts: &str, text: &str, old: Option<&str>) {
    let data_dir = dir.join(ts);
    std::fs::create_dir(&data_dir).expect("mkdir");
    std::fs::write(data_dir.join("word"), text).expect("write");
    symlink(ts, dir.join("..data_tmp")).expect("symlink");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("rename");
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("remove old");
    }
}

#[tokio::test]
async fn configmap_symlink_swaps_are_picked_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ts = [
        "..2026_11_30_01_02_03.123",
        "..2026_11_30_01_05_00.456",
        "..2026_11_30_01_09_59.789",
    ];
    configmap_update(dir.path(), ts[0], "a", None);
    symlink("..data/word", dir.path().join("word")).expect("symlink");

    let w: WatchedFile<Word> = spawn(Some(dir.path().join("word")), NO_POLL).expect("spawn");
    let mut rx = w.subscribe();
    assert_eq!(w.current().0, "a");

    configmap_update(dir.path(), ts[1], "b", Some(ts[0]));
    assert_eq!(next_word(&mut rx).await, "b");
    configmap_update(dir.path(), ts[2], "c", Some(ts[1]));
    assert_eq!(next_word(&mut rx).await, "c");
    assert_eq!(w.reloads(), 2);
}

#[tokio::test]
async fn missing_file_means_the_fallback_until_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    let w: WatchedFile<Word> = spawn(Some(path.clone()), NO_POLL).expect("spawn");
    let mut rx = w.subscribe();
    assert_eq!(*w.current(), Word::fallback());
    assert!(w.stats().file_missing());

    std::fs::write(&path, "a").expect("write");
    assert_eq!(next_word(&mut rx).await, "a");
    assert!(!w.stats().file_missing());
}

#[tokio::test]
async fn deleted_file_keeps_last_good() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    let w = watched(&path, "a");
    let mut rx = w.subscribe();

    std::fs::remove_file(&path).expect("remove");
    eventually(|| w.stats().file_missing()).await;
    assert!(!rx.has_changed().expect("sender alive"));
    assert_eq!(w.current().0, "a");
    assert_eq!(w.reload_failures(), 0);

    // Still watching.
    std::fs::write(&path, "b").expect("write");
    assert_eq!(next_word(&mut rx).await, "b");
}

#[tokio::test]
async fn polling_alone_picks_up_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("word");
    std::fs::write(&path, "a").expect("write");
    let options = WatchOptions {
        poll: Duration::from_millis(50),
        use_notify: false,
        ..WatchOptions::default()
    };
    let w = spawn_with::<Word>(Some(path.clone()), options).expect("spawn");
    let mut rx = w.subscribe();
    std::fs::write(&path, "b").expect("write");
    assert_eq!(next_word(&mut rx).await, "b");
}

#[tokio::test]
async fn unwatchable_directory_falls_back_to_polling() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The directory does not exist yet, so notify cannot watch it.
    let sub = dir.path().join("later");
    let path = sub.join("word");
    let options = WatchOptions {
        poll: Duration::from_millis(50),
        ..WatchOptions::default()
    };
    let w = spawn_with::<Word>(Some(path.clone()), options).expect("spawn");
    let mut rx = w.subscribe();
    assert_eq!(*w.current(), Word::fallback());
    std::fs::create_dir(&sub).expect("mkdir");
    std::fs::write(&path, "a").expect("write");
    assert_eq!(next_word(&mut rx).await, "a");
}

#[tokio::test]
async fn no_path_is_the_fallback_forever() {
    let w: WatchedFile<Word> = spawn(None, NO_POLL).expect("fallback");
    assert_eq!(*w.current(), Word::fallback());
    assert_eq!(w.path(), None);
    let mut rx = w.subscribe();
    // Nothing is ever published, but the channel stays open.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), rx.changed())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn dropping_the_watch_closes_the_channel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = watched(&dir.path().join("word"), "a");
    let mut rx = w.subscribe();
    drop(w);
    assert!(within_async(LIMIT, rx.changed()).await.is_err());
}

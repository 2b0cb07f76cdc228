use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use rdma_streams_testkit::within_async;

use super::*;

/// What one test may take at most.
const LIMIT: Duration = Duration::from_secs(20);

/// GET `path` from `addr`: the status and the body, or `None` when nothing listens.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).await.ok()?;
    let code = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_owned();
    Some((code, body))
}

#[derive(Debug, thiserror::Error)]
enum MainError {
    #[error(transparent)]
    Runtime(#[from] Error),
    #[error("main failed")]
    Failed,
}

fn local() -> Option<SocketAddr> {
    Some(([127, 0, 0, 1], 0).into())
}

/// The runtime `builder` builds, with a shutdown trigger of the test's own.
async fn triggered(builder: Builder) -> (CancellationToken, Runtime) {
    let trigger = CancellationToken::new();
    let rt = builder
        .with_shutdown(trigger.clone())
        .build()
        .await
        .unwrap();
    (trigger, rt)
}

/// A main that waits for shutdown and ends well.
fn idle_main(rt: &Runtime) -> impl Future<Output = Result<(), MainError>> + Send + 'static {
    let tasks = rt.tasks().clone();
    async move {
        tasks.shutdown().cancelled().await;
        Ok(())
    }
}

#[tokio::test]
async fn tasks_run_until_shutdown_and_run_returns_mains_result() {
    within_async(LIMIT, async {
        let (trigger, rt) = triggered(Runtime::builder()).await;
        let tasks = rt.tasks().clone();
        let stopped = Arc::new(AtomicUsize::new(0));
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let counter = stopped.clone();
        let run = tokio::spawn(rt.run(async move {
            for i in 0..3 {
                let stop = tasks.shutdown().clone();
                let counter = counter.clone();
                tasks.spawn(format!("worker {i}"), async move {
                    stop.cancelled().await;
                    counter.fetch_add(1, Ordering::SeqCst);
                });
            }
            let _ = started_tx.send(());
            tasks.shutdown().cancelled().await;
            Ok::<_, MainError>(42)
        }));
        started_rx.await.unwrap();
        trigger.cancel();
        assert_eq!(run.await.unwrap().unwrap(), 42);
        assert_eq!(
            stopped.load(Ordering::SeqCst),
            3,
            "every task ran to its end"
        );
    })
    .await;
}

#[tokio::test]
async fn main_returning_stops_the_tasks() {
    within_async(LIMIT, async {
        let rt = Runtime::builder().build().await.unwrap();
        let tasks = rt.tasks().clone();
        let stopped = Arc::new(AtomicUsize::new(0));
        let counter = stopped.clone();
        let result = rt
            .run(async move {
                let stop = tasks.shutdown().clone();
                tasks.spawn("worker", async move {
                    stop.cancelled().await;
                    counter.fetch_add(1, Ordering::SeqCst);
                });
                tokio::task::yield_now().await;
                Err::<(), _>(MainError::Failed)
            })
            .await;
        assert!(matches!(result, Err(MainError::Failed)));
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test]
async fn ready_fails_first_then_tasks_stop_then_the_admin_endpoint() {
    within_async(LIMIT, async {
        let (trigger, rt) = triggered(
            Runtime::builder()
                .admin(local())
                .drain_delay(Duration::from_millis(400)),
        )
        .await;
        let admin = rt.admin_addr().unwrap();
        let gate = rt.readiness().gate("cache");
        let tasks = rt.tasks().clone();
        let stopped_at = Arc::new(Mutex::new(None));
        let at = stopped_at.clone();
        let run = tokio::spawn(rt.run(async move {
            tasks.shutdown().cancelled().await;
            *at.lock().unwrap() = Some(Instant::now());
            Ok::<_, MainError>(())
        }));

        assert_eq!(
            get(admin, "/ready").await,
            Some((503, "not ready: cache\n".into()))
        );
        gate.set(true);
        assert_eq!(get(admin, "/ready").await, Some((200, "ready\n".into())));
        assert_eq!(get(admin, "/live").await, Some((200, "live\n".into())));
        assert_eq!(get(admin, "/metrics").await, Some((200, "# EOF\n".into())));

        let asked = Instant::now();
        trigger.cancel();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Draining: not ready, still serving, main not yet told to stop.
        assert_eq!(
            get(admin, "/ready").await,
            Some((503, "not ready: draining\n".into()))
        );
        assert!(stopped_at.lock().unwrap().is_none());
        run.await.unwrap().unwrap();
        let stopped = stopped_at.lock().unwrap().unwrap();
        assert!(stopped - asked >= Duration::from_millis(400));
        assert_eq!(
            get(admin, "/ready").await,
            None,
            "the admin endpoint stopped"
        );
    })
    .await;
}

#[tokio::test]
async fn a_process_that_was_not_ready_stops_without_the_drain_delay() {
    within_async(LIMIT, async {
        let (trigger, rt) =
            triggered(Runtime::builder().drain_delay(Duration::from_secs(30))).await;
        let _never = rt.readiness().gate("certificate");
        trigger.cancel();
        let started = Instant::now();
        let main = idle_main(&rt);
        rt.run(main).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    })
    .await;
}

#[tokio::test]
async fn the_metrics_published_are_served() {
    within_async(LIMIT, async {
        let (trigger, rt) = triggered(Runtime::builder().admin(local())).await;
        let admin = rt.admin_addr().unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let gauge = prometheus_client::metrics::gauge::Gauge::<i64>::default();
        registry.register("up", "Up", gauge.clone());
        gauge.set(1);
        rt.metrics().publish(registry).unwrap();
        let main = idle_main(&rt);
        let run = tokio::spawn(rt.run(main));
        let (code, body) = get(admin, "/metrics").await.unwrap();
        assert_eq!(code, 200);
        assert!(body.contains("up 1"), "{body}");
        trigger.cancel();
        run.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_task_that_ignores_shutdown_is_aborted_at_the_timeout() {
    within_async(LIMIT, async {
        let rt = Runtime::builder()
            .drain_timeout(Duration::from_millis(200))
            .build()
            .await
            .unwrap();
        let tasks = rt.tasks().clone();
        let dropped = Arc::new(AtomicUsize::new(0));
        struct Count(Arc<AtomicUsize>);
        impl Drop for Count {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Count(dropped.clone());
        let started = Instant::now();
        rt.run(async move {
            tasks.spawn("stubborn", async move {
                let _count = count;
                std::future::pending::<()>().await;
            });
            Ok::<_, MainError>(())
        })
        .await
        .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the task was aborted");
    })
    .await;
}

#[tokio::test]
async fn a_main_that_ignores_shutdown_is_an_error_at_the_timeout() {
    within_async(LIMIT, async {
        let (trigger, rt) =
            triggered(Runtime::builder().drain_timeout(Duration::from_millis(100))).await;
        trigger.cancel();
        let result = rt
            .run(std::future::pending::<Result<(), MainError>>())
            .await;
        assert!(
            matches!(result, Err(MainError::Runtime(Error::DrainTimeout { .. }))),
            "{result:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn failed_panicked_and_aborted_tasks_are_reported_by_name() {
    within_async(LIMIT, async {
        let mut set = TaskSet::default();
        set.spawn("fine", async {});
        set.spawn("failing", async {
            Err::<(), _>(std::io::Error::other("disk on fire"))
        });
        set.spawn("panicking", async {
            if "boom".len() == 4 {
                panic!("boom");
            }
        });
        set.spawn("stuck", std::future::pending::<()>());
        let drained = set.drain(Duration::from_millis(200)).await;
        let mut failed = drained.failed;
        failed.sort();
        assert_eq!(
            failed,
            [
                ("failing".to_owned(), "disk on fire".to_owned()),
                ("panicking".to_owned(), "panicked: boom".to_owned()),
            ]
        );
        assert_eq!(drained.aborted, ["stuck"]);
    })
    .await;
}

#[tokio::test]
async fn an_adopted_task_is_waited_for_and_aborted_with_the_set() {
    within_async(LIMIT, async {
        let rt = Runtime::builder()
            .drain_timeout(Duration::from_millis(200))
            .build()
            .await
            .unwrap();
        let tasks = rt.tasks().clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let adopted = tokio::spawn(async move {
            // Holds `done_tx` until aborted.
            let _done = done_tx;
            let _ = rx.await;
            std::future::pending::<()>().await;
        });
        rt.run(async move {
            tasks.adopt("adopted", adopted);
            drop(tx);
            Ok::<_, MainError>(())
        })
        .await
        .unwrap();
        assert!(done_rx.await.is_err(), "the adopted task was aborted");
    })
    .await;
}

#[tokio::test]
async fn a_taken_admin_address_is_a_build_error() {
    within_async(LIMIT, async {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let error = Runtime::builder()
            .admin(Some(addr))
            .build()
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Admin(BindError { addr: a, .. }) if a == addr));
        assert_eq!(
            error.to_string(),
            format!("binding the admin endpoint on {addr}")
        );
    })
    .await;
}

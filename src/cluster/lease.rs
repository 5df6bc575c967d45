//! Leader election on a `coordination.k8s.io/v1` Lease.
//!
//! Every replica renders and serves; only the leader writes Ingress status and Events, so that
//! replicas neither fight over the same status field nor post every Event once per replica.
//! The protocol is client-go's: the holder keeps `renewTime` fresh, and any replica may take
//! the Lease over once `renewTime + leaseDurationSeconds` has passed. Writes carry the
//! `resourceVersion` that was read, so of two replicas racing for the Lease only one succeeds.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// client-go's default lease duration; also assumed for Leases that do not state one.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// Errors are logged at warn at most this often while they persist; the rest go to debug.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Which Lease to compete for, under which name, and how often.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    /// The Lease name (`--election-id`); replicas of one deployment share it.
    pub name: String,
    /// This replica's name in `holderIdentity`, normally the pod name.
    pub identity: String,
    /// How long others wait after the last renewal before taking over.
    pub lease_duration: Duration,
    /// How often the Lease is read and, when held, renewed.
    pub renew_interval: Duration,
}

impl LeaseConfig {
    /// client-go's timing: a 15 s lease renewed every 5 s.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_interval: DEFAULT_LEASE_DURATION / 3,
        }
    }

    /// How long after a renewal *started* this replica goes on acting as leader. Four fifths
    /// of the lease, so that it has stopped before any other replica may take over, even with
    /// a little clock skew or a slow response.
    fn leading_for(&self) -> Duration {
        self.lease_duration / 5 * 4
    }

    /// The renew interval, capped so that a held Lease gets at least two renewal attempts
    /// before [`Self::leading_for`] runs out; a longer interval would make the leader flap.
    fn renew_every(&self) -> Duration {
        self.renew_interval
            .min(self.leading_for() / 2)
            .max(Duration::from_millis(10))
    }

    /// `leaseDurationSeconds`: whole seconds, rounded up so that others never wait less than
    /// this replica assumes.
    fn lease_seconds(&self) -> i32 {
        let d = self.lease_duration;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
    }
}

/// What to do with the Lease as it was just read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease yet: create it, held by us.
    Create,
    /// We hold it: renew it.
    Renew,
    /// Nobody holds it, or the holder let it expire: take it over.
    Acquire,
    /// Another replica holds a live Lease.
    Follow { holder: String },
}

/// Decides from the Lease as read (`None` if it does not exist) whether this replica may
/// hold it at `now`. A Lease whose holder stopped renewing expires `leaseDurationSeconds`
/// after its `renewTime` (its `acquireTime` if it was never renewed).
pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or_default();
    if holder.is_empty() {
        Decision::Acquire
    } else if holder == identity {
        Decision::Renew
    } else if spec.is_none_or(|s| expired(s, now)) {
        Decision::Acquire
    } else {
        Decision::Follow {
            holder: holder.to_string(),
        }
    }
}

fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let seconds = spec
        .lease_duration_seconds
        .filter(|s| *s > 0)
        .map_or(DEFAULT_LEASE_DURATION.as_secs(), |s| {
            s.unsigned_abs().into()
        });
    let ms = i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    renewed.0.as_millisecond().saturating_add(ms) < now.as_millisecond()
}

/// The Lease to write to hold it: created, renewed, or taken over (which counts as a
/// transition, as in client-go). Keeps the read `resourceVersion` for optimistic concurrency.
fn claimed(current: Option<Lease>, config: &LeaseConfig, now: Timestamp) -> Lease {
    let created = current.is_none();
    let mut lease = current.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            namespace: Some(config.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() == Some(config.identity.as_str()) {
        spec.acquire_time.get_or_insert(MicroTime(now));
    } else {
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(if created {
            0
        } else {
            spec.lease_transitions.unwrap_or(0).saturating_add(1)
        });
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(config.lease_seconds());
    lease
}

/// The Lease to write on shutdown: no holder and a one-second duration, as client-go's
/// `ReleaseOnCancel` does, so that another replica takes over at its next attempt.
fn released(mut lease: Lease, now: Timestamp) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(MicroTime(now));
    spec.acquire_time = Some(MicroTime(now));
    lease
}

/// Whether a write lost a race: someone else created or updated the Lease since it was read.
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.is_conflict() || s.is_already_exists())
}

/// The three Lease calls the election makes, so that the loop can be tested without a server.
trait LeaseApi: Send + Sync + 'static {
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, kube::Error>> + Send;
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send;
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send;
}

struct KubeLease {
    api: Api<Lease>,
    name: String,
}

impl LeaseApi for KubeLease {
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        self.api.get_opt(&self.name).await
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api.create(&PostParams::default(), lease).await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
    }
}

/// A running election. Must be kept: dropping it ends the election (the Lease is then
/// released in the background).
#[derive(Debug)]
#[must_use = "dropping the Elector ends the election"]
pub struct Elector {
    leader: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Elector {
    /// Whether this replica may write status and Events now.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Leadership changes, for tasks that start and stop with it.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// Stops competing and, if leading, hands the Lease back so that another replica takes
    /// over at once instead of after the lease duration. Leadership ends before the write.
    pub async fn release(self) {
        self.stop.send_replace(true);
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "leader election task failed");
        }
    }
}

/// Starts competing for the Lease in a background task (needs a Tokio runtime).
pub fn spawn(client: kube::Client, config: LeaseConfig) -> Elector {
    let api = KubeLease {
        api: Api::namespaced(client, &config.namespace),
        name: config.name.clone(),
    };
    spawn_with(api, config)
}

fn spawn_with<A: LeaseApi>(api: A, config: LeaseConfig) -> Elector {
    let (leader_tx, leader) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let state = State {
        leader: leader_tx,
        leading_until: None,
        holder: None,
        failing_since: None,
        warned_at: None,
    };
    let task = tokio::spawn(run(api, config, state, stop_rx));
    Elector { leader, stop, task }
}

/// The result of one round that reached the API server.
#[derive(Debug)]
enum Outcome {
    /// We wrote the Lease as holder.
    Leading,
    /// Another replica holds it.
    Following(String),
    /// Another replica wrote the Lease between our read and our write.
    Raced,
}

#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
}

/// The election's view of itself, owned by the task.
#[derive(Debug)]
struct State {
    leader: watch::Sender<bool>,
    /// Set while leading: when to stop acting as leader unless renewed before.
    leading_until: Option<Instant>,
    /// The holder last reported, so that "leader is X" is logged once per change.
    holder: Option<String>,
    failing_since: Option<Instant>,
    warned_at: Option<Instant>,
}

impl State {
    fn lead(&mut self, until: Instant, identity: &str) {
        if until <= Instant::now() {
            return;
        }
        self.leading_until = Some(until);
        if !self.leader.send_replace(true) {
            tracing::info!(identity, "became leader");
        }
        self.holder = Some(identity.to_string());
    }

    fn step_down(&mut self, reason: &str) {
        self.leading_until = None;
        if self.leader.send_replace(false) {
            tracing::info!(reason, "lost leadership");
        }
    }

    fn follow(&mut self, holder: String) {
        self.step_down("another replica holds the lease");
        if self.holder.as_deref() != Some(holder.as_str()) {
            tracing::info!(leader = %holder, "leader is {holder}");
            self.holder = Some(holder);
        }
    }

    fn succeeded(&mut self) {
        if let Some(since) = self.failing_since.take() {
            tracing::info!(after = ?since.elapsed(), "leader election reaches the API server again");
        }
        self.warned_at = None;
    }

    fn failed(&mut self, error: &RoundError) {
        let now = Instant::now();
        let first = self.failing_since.is_none();
        self.failing_since.get_or_insert(now);
        if first || self.warned_at.is_none_or(|t| now - t >= WARN_EVERY) {
            self.warned_at = Some(now);
            tracing::warn!(error = %error, leading = self.leading_until.is_some(), "leader election cannot read or renew the lease");
        } else {
            tracing::debug!(error = %error, "leader election cannot read or renew the lease");
        }
    }

    fn observe(
        &mut self,
        result: Result<Outcome, RoundError>,
        started: Instant,
        config: &LeaseConfig,
    ) {
        match result {
            Ok(outcome) => {
                self.succeeded();
                match outcome {
                    Outcome::Leading => self.lead(started + config.leading_for(), &config.identity),
                    Outcome::Following(holder) => self.follow(holder),
                    Outcome::Raced => {
                        tracing::debug!("another replica wrote the lease first");
                        self.step_down("another replica wrote the lease first");
                    }
                }
            }
            // Still leader until `leading_until`, which `until_stopped` enforces.
            Err(e) => self.failed(&e),
        }
    }
}

async fn run<A: LeaseApi>(
    api: A,
    config: LeaseConfig,
    mut state: State,
    mut stop: watch::Receiver<bool>,
) {
    let every = config.renew_every();
    loop {
        let started = Instant::now();
        let attempt = tokio::time::timeout(every, round(&api, &config));
        let Some(result) = until_stopped(attempt, &mut state, &mut stop).await else {
            break;
        };
        let result = result.unwrap_or(Err(RoundError::Timeout(every)));
        state.observe(result, started, &config);
        let wait = tokio::time::sleep_until(started + every);
        if until_stopped(wait, &mut state, &mut stop).await.is_none() {
            break;
        }
    }
    let was_leading = state.leading_until.is_some();
    state.step_down("shutting down");
    if was_leading {
        release_lease(&api, &config).await;
    }
}

/// Awaits `fut` unless asked to stop, meanwhile stepping down when leadership runs out, so that
/// a hung request cannot keep this replica leader past the moment others may take over.
async fn until_stopped<F: Future>(
    fut: F,
    state: &mut State,
    stop: &mut watch::Receiver<bool>,
) -> Option<F::Output> {
    tokio::pin!(fut);
    loop {
        let deadline = state.leading_until;
        tokio::select! {
            out = &mut fut => return Some(out),
            _ = stop.changed() => return None,
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                state.step_down("the lease could not be renewed in time");
            }
        }
    }
}

/// One read-decide-write round.
async fn round<A: LeaseApi>(api: &A, config: &LeaseConfig) -> Result<Outcome, RoundError> {
    let now = Timestamp::now();
    let current = api.get().await?;
    let written = match decide(current.as_ref(), &config.identity, now) {
        Decision::Follow { holder } => return Ok(Outcome::Following(holder)),
        Decision::Create => api.create(&claimed(None, config, now)).await,
        Decision::Renew | Decision::Acquire => api.replace(&claimed(current, config, now)).await,
    };
    match written {
        Ok(_) => Ok(Outcome::Leading),
        Err(e) if is_conflict(&e) => Ok(Outcome::Raced),
        Err(e) => Err(e.into()),
    }
}

/// Hands the Lease back if we still hold it; bounded so that shutdown is never held up.
async fn release_lease<A: LeaseApi>(api: &A, config: &LeaseConfig) {
    let attempt = async {
        let Some(current) = api.get().await? else {
            return Ok::<bool, kube::Error>(false);
        };
        let holder = current
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(config.identity.as_str()) {
            return Ok(false);
        }
        api.replace(&released(current, Timestamp::now())).await?;
        Ok(true)
    };
    match tokio::time::timeout(config.renew_every(), attempt).await {
        Ok(Ok(true)) => tracing::info!("released the lease"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot release the lease; another replica takes over when it expires");
        }
        Err(_) => tracing::warn!(
            "cannot release the lease in time; another replica takes over when it expires"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use kube::core::Status;

    use super::*;

    const T0: i64 = 1_700_000_000;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: i64, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("portcullis".into()),
                namespace: Some("ingress".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: Some(MicroTime(at(renewed))),
                acquire_time: Some(MicroTime(at(renewed - 100))),
                lease_duration_seconds: Some(duration),
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    fn config(identity: &str) -> LeaseConfig {
        LeaseConfig::new("ingress", "portcullis", identity)
    }

    #[test]
    fn decides_like_client_go() {
        let now = at(T0);
        assert_eq!(decide(None, "a", now), Decision::Create);
        let held_by_b = lease(Some("b"), T0 - 5, 15);
        assert_eq!(
            decide(Some(&held_by_b), "a", now),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(decide(Some(&held_by_b), "b", now), Decision::Renew);
        // Exactly at expiry the holder still has it; one second later it is up for grabs.
        assert_eq!(
            decide(Some(&lease(Some("b"), T0 - 15, 15)), "a", now),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), T0 - 16, 15)), "a", now),
            Decision::Acquire
        );
        // Our own Lease is renewed even if it ran out: nobody else took it.
        assert_eq!(
            decide(Some(&lease(Some("a"), T0 - 60, 15)), "a", now),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&lease(None, T0, 15)), "a", now),
            Decision::Acquire
        );
        assert_eq!(
            decide(Some(&lease(Some(""), T0, 15)), "a", now),
            Decision::Acquire
        );
    }

    #[test]
    fn missing_fields_are_read_safely() {
        let now = at(T0);
        // No duration: the default 15 s applies.
        let mut l = lease(Some("b"), T0 - 10, 15);
        l.spec.as_mut().unwrap().lease_duration_seconds = None;
        assert!(matches!(
            decide(Some(&l), "a", now),
            Decision::Follow { .. }
        ));
        // No renewTime: acquireTime counts.
        l.spec.as_mut().unwrap().renew_time = None;
        assert_eq!(decide(Some(&l), "a", now), Decision::Acquire);
        // A holder and no times at all: nothing says it is alive.
        l.spec.as_mut().unwrap().acquire_time = None;
        assert_eq!(decide(Some(&l), "a", now), Decision::Acquire);
        // No spec at all.
        l.spec = None;
        assert_eq!(decide(Some(&l), "a", now), Decision::Acquire);
    }

    #[test]
    fn claiming_sets_holder_times_and_transitions() {
        let now = at(T0);
        let created = claimed(None, &config("a"), now);
        assert_eq!(created.metadata.name.as_deref(), Some("portcullis"));
        assert_eq!(created.metadata.namespace.as_deref(), Some("ingress"));
        let spec = created.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));

        let taken = claimed(Some(lease(Some("b"), T0 - 20, 15)), &config("a"), now);
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"));
        let spec = taken.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));

        let renewed = claimed(Some(lease(Some("a"), T0 - 5, 15)), &config("a"), now);
        let spec = renewed.spec.unwrap();
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.acquire_time, Some(MicroTime(at(T0 - 105))));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
    }

    #[test]
    fn released_lease_is_free_at_once() {
        let l = released(lease(Some("a"), T0 - 5, 15), at(T0));
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(decide(Some(&l), "b", at(T0)), Decision::Acquire);
    }

    #[test]
    fn timing_is_derived_safely() {
        let c = config("a");
        assert_eq!(c.leading_for(), Duration::from_secs(12));
        assert_eq!(c.renew_every(), Duration::from_secs(5));
        let slow = LeaseConfig {
            renew_interval: Duration::from_secs(30),
            ..config("a")
        };
        assert_eq!(slow.renew_every(), Duration::from_secs(6));
        let odd = LeaseConfig {
            lease_duration: Duration::from_millis(1500),
            ..config("a")
        };
        assert_eq!(odd.lease_seconds(), 2);
    }

    /// An in-memory Lease endpoint with resourceVersion checks and an off switch.
    #[derive(Default)]
    struct Fake {
        lease: Mutex<Option<Lease>>,
        version: Mutex<u64>,
        down: AtomicBool,
    }

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure(reason, reason).with_code(code)))
    }

    impl Fake {
        fn lease(&self) -> Option<Lease> {
            self.lease.lock().unwrap().clone()
        }

        fn holder(&self) -> Option<String> {
            self.lease()
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
        }

        fn store(&self, lease: &Lease) -> Lease {
            let mut version = self.version.lock().unwrap();
            *version += 1;
            let mut stored = lease.clone();
            stored.metadata.resource_version = Some(version.to_string());
            *self.lease.lock().unwrap() = Some(stored.clone());
            stored
        }

        fn check_up(&self) -> Result<(), kube::Error> {
            if self.down.load(Ordering::SeqCst) {
                Err(api_error(503, "ServiceUnavailable"))
            } else {
                Ok(())
            }
        }
    }

    impl LeaseApi for Arc<Fake> {
        fn get(&self) -> impl Future<Output = Result<Option<Lease>, kube::Error>> + Send {
            std::future::ready(self.check_up().map(|()| self.lease()))
        }

        fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send {
            let result = self.check_up().and_then(|()| match self.lease() {
                Some(_) => Err(api_error(409, "AlreadyExists")),
                None => Ok(self.store(lease)),
            });
            std::future::ready(result)
        }

        fn replace(
            &self,
            lease: &Lease,
        ) -> impl Future<Output = Result<Lease, kube::Error>> + Send {
            let result = self.check_up().and_then(|()| {
                let current = self.lease().and_then(|l| l.metadata.resource_version);
                if current.is_some() && current == lease.metadata.resource_version {
                    Ok(self.store(lease))
                } else {
                    Err(api_error(409, "Conflict"))
                }
            });
            std::future::ready(result)
        }
    }

    fn fast(identity: &str) -> LeaseConfig {
        LeaseConfig {
            lease_duration: Duration::from_secs(1),
            renew_interval: Duration::from_millis(100),
            ..config(identity)
        }
    }

    async fn wait_for(rx: &mut watch::Receiver<bool>, value: bool, within: Duration) -> bool {
        tokio::time::timeout(within, rx.wait_for(|v| *v == value))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_leader_and_a_quick_handover_on_release() {
        let fake = Arc::new(Fake::default());
        let a = spawn_with(fake.clone(), fast("a"));
        let mut a_rx = a.subscribe();
        assert!(wait_for(&mut a_rx, true, Duration::from_secs(2)).await);
        let b = spawn_with(fake.clone(), fast("b"));
        let mut b_rx = b.subscribe();
        // b follows for longer than a lease duration: a keeps renewing.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(a.is_leader());
        assert!(!b.is_leader());
        assert_eq!(fake.holder().as_deref(), Some("a"));

        a.release().await;
        assert!(!*a_rx.borrow());
        assert_eq!(fake.holder(), None);
        // Without a holder the Lease is free: b takes over at its next round, well within the
        // lease duration it would otherwise have had to wait.
        assert!(wait_for(&mut b_rx, true, Duration::from_millis(500)).await);
        let spec = fake.lease().unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        b.release().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_replicas_elect_exactly_one() {
        let fake = Arc::new(Fake::default());
        let electors: Vec<Elector> = ["a", "b", "c"]
            .iter()
            .map(|id| spawn_with(fake.clone(), fast(id)))
            .collect();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let leaders: Vec<bool> = electors.iter().map(Elector::is_leader).collect();
        assert_eq!(leaders.iter().filter(|l| **l).count(), 1, "{leaders:?}");
        for e in electors {
            e.release().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn steps_down_before_the_lease_expires_when_the_server_is_gone() {
        let fake = Arc::new(Fake::default());
        let a = spawn_with(fake.clone(), fast("a"));
        let mut rx = a.subscribe();
        assert!(wait_for(&mut rx, true, Duration::from_secs(2)).await);
        fake.down.store(true, Ordering::SeqCst);
        assert!(wait_for(&mut rx, false, Duration::from_secs(2)).await);
        let stepped_down = Timestamp::now();
        let spec = fake.lease().unwrap().spec.unwrap();
        let expiry_ms = spec.renew_time.unwrap().0.as_millisecond() + 1000;
        assert!(
            stepped_down.as_millisecond() < expiry_ms,
            "stepped down {} ms after the lease expired",
            stepped_down.as_millisecond() - expiry_ms
        );
        // Back online: the Lease is still ours, so leadership resumes.
        fake.down.store(false, Ordering::SeqCst);
        assert!(wait_for(&mut rx, true, Duration::from_secs(2)).await);
        a.release().await;
    }
}

//! Batching and queueing policy of a model version, read once from its configuration.

use std::collections::HashMap;
use std::time::Duration;

// tokio's clock (the same as std's unless a test pauses it), so the unit tests can drive time.
use tokio::time::Instant;

use crate::config::{ModelConfig, pb};
use crate::infer::InferRequest;

/// What happens to a request whose queue timeout expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutAction {
    /// Fail it with a timeout error.
    Reject,
    /// Keep it queued; it runs when its turn comes.
    Delay,
}

/// Queue policy of one priority level (`ModelQueuePolicy`).
#[derive(Clone, Debug)]
pub struct QueuePolicy {
    pub timeout_action: TimeoutAction,
    pub default_timeout: Option<Duration>,
    pub allow_timeout_override: bool,
    /// 0 means unbounded.
    pub max_queue_size: usize,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        QueuePolicy {
            timeout_action: TimeoutAction::Reject,
            default_timeout: None,
            allow_timeout_override: false,
            max_queue_size: 0,
        }
    }
}

impl QueuePolicy {
    fn from_config(p: &pb::ModelQueuePolicy) -> QueuePolicy {
        QueuePolicy {
            timeout_action: if p.timeout_action
                == pb::model_queue_policy::TimeoutAction::Delay as i32
            {
                TimeoutAction::Delay
            } else {
                TimeoutAction::Reject
            },
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_timeout_override: p.allow_timeout_override,
            max_queue_size: usize::try_from(p.max_queue_size).unwrap_or(0),
        }
    }

    /// When a request queued at `now` times out, given its own `timeout` parameter.
    pub fn deadline(&self, now: Instant, requested: Option<Duration>) -> Option<Instant> {
        // A request may shorten the default timeout when overrides are allowed (never lengthen
        // it, as in Triton); with no default, its own timeout is the only one there is.
        let timeout = match (requested.filter(|t| !t.is_zero()), self.default_timeout) {
            (Some(t), Some(d)) if self.allow_timeout_override => Some(t.min(d)),
            (Some(t), None) => Some(t),
            (_, default) => default,
        };
        timeout.map(|t| now + t)
    }
}

/// How a model version's requests are grouped into executions.
#[derive(Clone, Debug)]
pub struct BatchPolicy {
    /// `max_batch_size`; 0 means the model takes no batch dimension.
    pub max_batch_size: usize,
    /// Present when `dynamic_batching` is configured.
    pub dynamic: Option<DynamicBatching>,
    /// Input names whose shapes may differ between merged requests (`allow_ragged_batch`).
    pub ragged_inputs: Vec<String>,
    /// The server's `--default-max-queue-size`, for levels whose policy sets no bound.
    pub default_max_queue_size: usize,
}

/// The `dynamic_batching` settings.
#[derive(Clone, Debug)]
pub struct DynamicBatching {
    pub preferred_batch_sizes: Vec<usize>,
    pub max_queue_delay: Duration,
    pub preserve_ordering: bool,
    /// At least 1.
    pub priority_levels: usize,
    /// 1-based.
    pub default_priority_level: usize,
    pub default_queue_policy: QueuePolicy,
    pub priority_queue_policy: HashMap<usize, QueuePolicy>,
}

/// A stateful model batches the requests of different sequences as a dynamic batcher would,
/// with its strategy's delay (and `oldest`'s preferred sizes and ordering); the steps of one
/// sequence never share a batch (the sequencer runs them one at a time).
fn sequence_batching(config: &ModelConfig) -> Option<crate::config::pb::ModelDynamicBatching> {
    use crate::config::pb::model_config::SchedulingChoice;
    use crate::config::pb::model_sequence_batching::StrategyChoice;
    let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
        return None;
    };
    let mut dynamic = crate::config::pb::ModelDynamicBatching::default();
    match &sb.strategy_choice {
        Some(StrategyChoice::Oldest(oldest)) => {
            dynamic.max_queue_delay_microseconds = oldest.max_queue_delay_microseconds;
            dynamic.preferred_batch_size = oldest.preferred_batch_size.clone();
            dynamic.preserve_ordering = oldest.preserve_ordering;
        }
        Some(StrategyChoice::Direct(direct)) => {
            dynamic.max_queue_delay_microseconds = direct.max_queue_delay_microseconds;
        }
        None => {}
    }
    Some(dynamic)
}

impl BatchPolicy {
    pub fn from_config(config: &ModelConfig) -> BatchPolicy {
        let dynamic = crate::config::dynamic_batching(config)
            .cloned()
            .or_else(|| sequence_batching(config))
            .filter(|_| config.max_batch_size > 0)
            .map(|d| {
                let levels = usize::try_from(d.priority_levels).unwrap_or(0).max(1);
                DynamicBatching {
                    preferred_batch_sizes: d
                        .preferred_batch_size
                        .iter()
                        .filter_map(|&p| usize::try_from(p).ok())
                        .collect(),
                    max_queue_delay: Duration::from_micros(d.max_queue_delay_microseconds),
                    preserve_ordering: d.preserve_ordering,
                    priority_levels: levels,
                    default_priority_level: usize::try_from(d.default_priority_level)
                        .unwrap_or(0)
                        .clamp(1, levels),
                    default_queue_policy: d
                        .default_queue_policy
                        .as_ref()
                        .map(QueuePolicy::from_config)
                        .unwrap_or_default(),
                    priority_queue_policy: d
                        .priority_queue_policy
                        .iter()
                        .filter_map(|(&k, v)| {
                            Some((usize::try_from(k).ok()?, QueuePolicy::from_config(v)))
                        })
                        .collect(),
                }
            });
        BatchPolicy {
            max_batch_size: usize::try_from(config.max_batch_size).unwrap_or(0),
            dynamic,
            ragged_inputs: config
                .input
                .iter()
                .filter(|i| i.allow_ragged_batch)
                .map(|i| i.name.clone())
                .collect(),
            default_max_queue_size: 0,
        }
    }

    /// Bounds every queue level whose policy sets no `max_queue_size` (0 leaves them unbounded).
    pub fn with_default_max_queue_size(mut self, bound: usize) -> BatchPolicy {
        self.default_max_queue_size = bound;
        self
    }

    pub fn priority_levels(&self) -> usize {
        self.dynamic.as_ref().map_or(1, |d| d.priority_levels)
    }

    pub fn preserve_ordering(&self) -> bool {
        self.dynamic.as_ref().is_some_and(|d| d.preserve_ordering)
    }

    /// The 0-based queue level for a request's `priority` (0 = the model's default).
    pub fn level_of(&self, priority: u32) -> usize {
        let Some(d) = &self.dynamic else { return 0 };
        let p = match usize::try_from(priority).unwrap_or(0) {
            0 => d.default_priority_level,
            p => p.min(d.priority_levels),
        };
        p - 1
    }

    /// The queue policy of a 0-based level.
    pub fn queue_policy(&self, level: usize) -> QueuePolicy {
        let mut policy = match &self.dynamic {
            Some(d) => d
                .priority_queue_policy
                .get(&(level + 1))
                .unwrap_or(&d.default_queue_policy)
                .clone(),
            None => QueuePolicy::default(),
        };
        if policy.max_queue_size == 0 {
            policy.max_queue_size = self.default_max_queue_size;
        }
        policy
    }

    /// Rows a request contributes to a batch: its batch dimension, or 1 for unbatched models.
    pub fn rows_of(&self, request: &InferRequest) -> usize {
        if self.max_batch_size == 0 {
            return 1;
        }
        request
            .inputs
            .first()
            .and_then(|t| t.shape.first())
            .and_then(|&d| usize::try_from(d).ok())
            .unwrap_or(1)
    }

    /// What must be equal for two requests to share a batch: the input names and each input's
    /// shape past the batch dimension (ragged inputs excepted).
    pub fn shape_key(&self, request: &InferRequest) -> Vec<(String, Vec<i64>)> {
        let skip = usize::from(self.max_batch_size > 0);
        let mut key: Vec<(String, Vec<i64>)> = request
            .inputs
            .iter()
            .map(|t| {
                let dims = if self.ragged_inputs.contains(&t.name) {
                    Vec::new()
                } else {
                    t.shape.iter().skip(skip).copied().collect()
                };
                (t.name.clone(), dims)
            })
            .collect();
        key.sort();
        key
    }
}

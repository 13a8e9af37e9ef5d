//! Custom metrics that guests define (the WIT `metrics` interface; Triton's
//! `pb_utils.MetricFamily`): counters, gauges and histograms on the server's `/metrics`, next
//! to its own families. The WIT calls land in `host.rs`, with the other imports.
//!
//! The registry holds families by name and their series by labels, both weakly: a series lives
//! while a guest holds a handle on it, and a family while a handle on it or one of its series
//! lives. So a model that is unloaded, or an instance replaced after a trap, takes its series
//! with it (the next instance's `initialize` makes them again, from zero: Prometheus reads that
//! as a counter reset), and nothing a guest stops using stays behind.
//!
//! A guest is not trusted with the scrape: names and labels are checked against the text
//! format's grammar, label values escaped, the server's own prefixes (`nv_`, `tessera_`)
//! refused, values that are not numbers refused, and each owner (the operator, or one tenant)
//! may hold at most [`MAX_SERIES_PER_OWNER`] live series, so one tenant cannot crowd out the
//! rest. A tenant's series carry the label `tenant`, which only the server sets, so two
//! tenants' series of one family never merge.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::tessera::inference::metrics::MetricKind;

/// Live series one owner (the operator, or one tenant) may hold across all families.
pub const MAX_SERIES_PER_OWNER: usize = 2_000;
/// Families on the server at once.
pub const MAX_FAMILIES: usize = 1_000;
/// Families one tenant's guests may have created and still hold, so that one tenant cannot take
/// every family of the server.
pub const MAX_FAMILIES_PER_TENANT: usize = 100;
const MAX_NAME_BYTES: usize = 200;
const MAX_DESCRIPTION_BYTES: usize = 1_024;
const MAX_LABELS: usize = 16;
const MAX_LABEL_VALUE_BYTES: usize = 1_024;
const MAX_BUCKETS: usize = 64;
/// The label the server puts on a tenant's series.
const TENANT_LABEL: &str = "tenant";
const RESERVED_PREFIXES: [&str; 2] = ["nv_", "tessera_"];

/// Every guest-defined family of one server.
#[derive(Default)]
pub struct CustomMetrics {
    families: Mutex<BTreeMap<String, Weak<Family>>>,
    /// Live series per owner (None: the operator's guests).
    owners: Mutex<HashMap<Option<String>, Arc<AtomicUsize>>>,
    /// Families each tenant created and that still live.
    tenant_families: Mutex<HashMap<String, Arc<AtomicUsize>>>,
}

/// One metric name: its help text, kind and series.
pub struct Family {
    name: String,
    help: String,
    kind: MetricKind,
    series: Mutex<BTreeMap<Labels, Weak<Series>>>,
    /// The count of families of the tenant that created it, given back when it goes.
    created_by: Option<Arc<AtomicUsize>>,
}

impl Drop for Family {
    fn drop(&mut self) {
        if let Some(count) = &self.created_by {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Label pairs, sorted by name (the tenant's first when there is one).
type Labels = Vec<(String, String)>;

/// One series: a family's value for one set of labels.
pub struct Series {
    family: Arc<Family>,
    labels: Labels,
    value: Mutex<Value>,
    /// Its owner's count of live series, given back on drop.
    owner_count: Arc<AtomicUsize>,
}

enum Value {
    Scalar(f64),
    Histogram {
        bounds: Vec<f64>,
        /// Observations at or below each bound (not cumulative).
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

impl Drop for Series {
    fn drop(&mut self) {
        self.owner_count.fetch_sub(1, Ordering::AcqRel);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a metrics lock leaves plain numbers behind: still usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn kind_name(kind: MetricKind) -> &'static str {
    match kind {
        MetricKind::Counter => "counter",
        MetricKind::Gauge => "gauge",
        MetricKind::Histogram => "histogram",
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*` (metric names) or, without `:`, label names.
fn valid_name(name: &str, colons: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic()
            || c == '_'
            || (colons && c == ':')
            || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

impl CustomMetrics {
    /// The family `name`, created when new (by the operator).
    pub fn family(
        &self,
        name: &str,
        description: &str,
        kind: MetricKind,
    ) -> Result<Arc<Family>, String> {
        self.family_for(name, description, kind, None)
    }

    /// The family `name`, created when new by `tenant`'s guest (None: the operator's).
    pub fn family_for(
        &self,
        name: &str,
        description: &str,
        kind: MetricKind,
        tenant: Option<&str>,
    ) -> Result<Arc<Family>, String> {
        if name.len() > MAX_NAME_BYTES || !valid_name(name, true) {
            return Err(format!(
                "'{}' is not a metric name: letters, digits, '_' and ':', not starting with a digit, at most {MAX_NAME_BYTES} bytes",
                name.chars().take(60).collect::<String>()
            ));
        }
        if let Some(prefix) = RESERVED_PREFIXES.iter().find(|p| name.starts_with(**p)) {
            return Err(format!(
                "metric names starting '{prefix}' are the server's own; choose another for '{name}'"
            ));
        }
        if description.len() > MAX_DESCRIPTION_BYTES {
            return Err(format!(
                "the description of '{name}' is over {MAX_DESCRIPTION_BYTES} bytes"
            ));
        }
        let mut families = lock(&self.families);
        if let Some(family) = families.get(name).and_then(Weak::upgrade) {
            if family.kind != kind {
                return Err(format!(
                    "metric family '{name}' exists as a {}; it cannot also be a {}",
                    kind_name(family.kind),
                    kind_name(kind)
                ));
            }
            return Ok(family);
        }
        if families.len() >= MAX_FAMILIES {
            families.retain(|_, f| f.strong_count() > 0);
            if families.len() >= MAX_FAMILIES {
                return Err(format!(
                    "the server holds {MAX_FAMILIES} custom metric families, its most"
                ));
            }
        }
        let created_by = match tenant {
            None => None,
            Some(tenant) => {
                let count = lock(&self.tenant_families)
                    .entry(tenant.to_owned())
                    .or_default()
                    .clone();
                if count.fetch_add(1, Ordering::AcqRel) >= MAX_FAMILIES_PER_TENANT {
                    count.fetch_sub(1, Ordering::AcqRel);
                    return Err(format!(
                        "tenant '{tenant}' holds {MAX_FAMILIES_PER_TENANT} custom metric families it created, its most"
                    ));
                }
                Some(count)
            }
        };
        let family = Arc::new(Family {
            name: name.to_owned(),
            help: description.to_owned(),
            kind,
            series: Mutex::default(),
            created_by,
        });
        families.insert(name.to_owned(), Arc::downgrade(&family));
        Ok(family)
    }

    /// The series of `family` with `labels`, owned by `tenant` (None: the operator).
    pub fn series(
        &self,
        family: &Arc<Family>,
        tenant: Option<&str>,
        labels: Vec<(String, String)>,
        buckets: Option<Vec<f64>>,
    ) -> Result<Arc<Series>, String> {
        let labels = checked_labels(&family.name, tenant, labels)?;
        let bounds = match (family.kind, buckets) {
            (MetricKind::Histogram, Some(bounds)) => Some(checked_buckets(&family.name, bounds)?),
            (MetricKind::Histogram, None) => {
                return Err(format!(
                    "histogram '{}' needs buckets (their upper bounds, increasing)",
                    family.name
                ));
            }
            (_, Some(_)) => {
                return Err(format!(
                    "'{}' is a {}: only a histogram has buckets",
                    family.name,
                    kind_name(family.kind)
                ));
            }
            (_, None) => None,
        };
        let mut series = lock(&family.series);
        if let Some(existing) = series.get(&labels).and_then(Weak::upgrade) {
            if let (Some(bounds), Value::Histogram { bounds: have, .. }) =
                (&bounds, &*lock(&existing.value))
                && bounds != have
            {
                return Err(format!(
                    "histogram '{}' has this series already, with other buckets ({have:?})",
                    family.name
                ));
            }
            return Ok(existing);
        }
        series.retain(|_, s| s.strong_count() > 0);
        let owner_count = lock(&self.owners)
            .entry(tenant.map(str::to_owned))
            .or_default()
            .clone();
        // Counted before it exists, so two racing creations cannot both pass the bound.
        if owner_count.fetch_add(1, Ordering::AcqRel) >= MAX_SERIES_PER_OWNER {
            owner_count.fetch_sub(1, Ordering::AcqRel);
            return Err(format!(
                "{} holds {MAX_SERIES_PER_OWNER} custom metric series, its most: drop some first",
                tenant.map_or("the operator".to_owned(), |t| format!("tenant '{t}'"))
            ));
        }
        let value = match bounds {
            Some(bounds) => Value::Histogram {
                counts: vec![0; bounds.len()],
                bounds,
                sum: 0.0,
                count: 0,
            },
            None => Value::Scalar(0.0),
        };
        let created = Arc::new(Series {
            family: family.clone(),
            labels: labels.clone(),
            value: Mutex::new(value),
            owner_count,
        });
        series.insert(labels, Arc::downgrade(&created));
        Ok(created)
    }

    /// Appends every live family with at least one live series, in the text format.
    pub fn render(&self, out: &mut String) {
        let families: Vec<Arc<Family>> = {
            let mut families = lock(&self.families);
            families.retain(|_, f| f.strong_count() > 0);
            families.values().filter_map(Weak::upgrade).collect()
        };
        for family in families {
            let series: Vec<Arc<Series>> = {
                let mut series = lock(&family.series);
                series.retain(|_, s| s.strong_count() > 0);
                series.values().filter_map(Weak::upgrade).collect()
            };
            if series.is_empty() {
                continue;
            }
            let help = family.help.replace('\\', "\\\\").replace('\n', "\\n");
            let name = &family.name;
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {}", kind_name(family.kind));
            for s in series {
                match &*lock(&s.value) {
                    Value::Scalar(v) => sample(out, name, "", &s.labels, None, *v),
                    Value::Histogram {
                        bounds,
                        counts,
                        sum,
                        count,
                    } => {
                        let mut cumulative = 0u64;
                        for (bound, n) in bounds.iter().zip(counts) {
                            cumulative += n;
                            let le = bound.to_string();
                            sample(out, name, "_bucket", &s.labels, Some(&le), cumulative);
                        }
                        sample(out, name, "_bucket", &s.labels, Some("+Inf"), *count);
                        sample(out, name, "_sum", &s.labels, None, *sum);
                        sample(out, name, "_count", &s.labels, None, *count);
                    }
                }
            }
        }
    }
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &Labels,
    le: Option<&str>,
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    out.push_str(suffix);
    let pairs = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(le.map(|le| ("le", le)));
    let mut first = true;
    for (key, value) in pairs {
        out.push(if first { '{' } else { ',' });
        first = false;
        let _ = write!(out, "{key}=\"{}\"", crate::metrics::escape_label(value));
    }
    if !first {
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

fn checked_labels(
    family: &str,
    tenant: Option<&str>,
    labels: Vec<(String, String)>,
) -> Result<Labels, String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "a series of '{family}' has at most {MAX_LABELS} labels"
        ));
    }
    let mut sorted: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in labels {
        if !valid_name(&key, false) || key.starts_with("__") || key == "le" {
            return Err(format!(
                "'{}' is not a label name for '{family}': letters, digits and '_', not starting with a digit or '__', not 'le'",
                key.chars().take(60).collect::<String>()
            ));
        }
        if key.len() > MAX_NAME_BYTES || value.len() > MAX_LABEL_VALUE_BYTES {
            return Err(format!(
                "label '{}' of '{family}' is too long (names {MAX_NAME_BYTES} bytes, values {MAX_LABEL_VALUE_BYTES})",
                key.chars().take(60).collect::<String>()
            ));
        }
        if tenant.is_some() && key == TENANT_LABEL {
            return Err(format!(
                "the label '{TENANT_LABEL}' of '{family}' is set by the server"
            ));
        }
        if sorted.insert(key.clone(), value).is_some() {
            return Err(format!("label '{key}' of '{family}' is given twice"));
        }
    }
    let mut out: Labels = tenant
        .map(|t| (TENANT_LABEL.to_owned(), t.to_owned()))
        .into_iter()
        .collect();
    out.extend(sorted);
    Ok(out)
}

fn checked_buckets(family: &str, bounds: Vec<f64>) -> Result<Vec<f64>, String> {
    if bounds.is_empty() || bounds.len() > MAX_BUCKETS {
        return Err(format!(
            "histogram '{family}' needs 1 to {MAX_BUCKETS} buckets, got {}",
            bounds.len()
        ));
    }
    if bounds.iter().any(|b| !b.is_finite()) || bounds.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "the buckets of histogram '{family}' must be finite and increasing, got {bounds:?}"
        ));
    }
    Ok(bounds)
}

impl Series {
    /// `op` (`increment`, `set` or `observe`) with `value`, when the family's kind has it.
    pub(super) fn update(&self, op: &str, value: f64) -> Result<(), String> {
        let name = &self.family.name;
        if value.is_nan() {
            return Err(format!("{op} of '{name}': the value is not a number"));
        }
        let kind = self.family.kind;
        let mut current = lock(&self.value);
        match (op, kind, &mut *current) {
            ("increment", MetricKind::Counter, Value::Scalar(v)) => {
                if value < 0.0 || value.is_infinite() {
                    return Err(format!(
                        "counter '{name}' only grows: increment by a finite value >= 0, not {value}"
                    ));
                }
                *v += value;
            }
            ("increment", MetricKind::Gauge, Value::Scalar(v)) => *v += value,
            ("set", MetricKind::Gauge, Value::Scalar(v)) => *v = value,
            (
                "observe",
                MetricKind::Histogram,
                Value::Histogram {
                    bounds,
                    counts,
                    sum,
                    count,
                },
            ) => {
                if let Some(i) = bounds.iter().position(|b| value <= *b) {
                    counts[i] += 1;
                }
                *sum += value;
                *count += 1;
            }
            _ => {
                let can = match kind {
                    MetricKind::Counter => "increment and value",
                    MetricKind::Gauge => "increment, set and value",
                    MetricKind::Histogram => "observe",
                };
                return Err(format!(
                    "'{name}' is a {}: it has {can}, not {op}",
                    kind_name(kind)
                ));
            }
        }
        Ok(())
    }

    /// A counter's or gauge's value.
    pub(super) fn value(&self) -> Result<f64, String> {
        match &*lock(&self.value) {
            Value::Scalar(v) => Ok(*v),
            Value::Histogram { .. } => Err(format!(
                "'{}' is a histogram: it has no single value (its buckets, sum and count are on /metrics)",
                self.family.name
            )),
        }
    }
}

/// The series a function's invocations made, held for the function's deployment: each
/// invocation is a fresh instance, so without this a series would leave `/metrics` when the
/// request that made it ends. Dropped with the function (a re-deploy or an unload).
#[derive(Default)]
pub struct SeriesKeeper(Mutex<HashMap<usize, Arc<Series>>>);

impl SeriesKeeper {
    /// Holds `series` (once, however often invocations ask for it).
    pub fn keep(&self, series: &Arc<Series>) {
        lock(&self.0)
            .entry(Arc::as_ptr(series) as usize)
            .or_insert_with(|| series.clone());
    }
}

/// A guest's handle on a family (the WIT `metric-family` resource).
pub struct GuestFamily(pub(super) Arc<Family>);

/// A guest's handle on a series (the WIT `metric` resource).
pub struct GuestMetric(pub(super) Arc<Series>);

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(m: &CustomMetrics) -> String {
        let mut out = String::new();
        m.render(&mut out);
        out
    }

    #[test]
    fn families_are_shared_by_name_and_keep_their_kind() {
        let m = CustomMetrics::default();
        let a = m
            .family("latency_ns", "first", MetricKind::Counter)
            .unwrap();
        let b = m
            .family("latency_ns", "second", MetricKind::Counter)
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let err = m
            .family("latency_ns", "x", MetricKind::Gauge)
            .err()
            .unwrap();
        assert!(err.contains("exists as a counter"), "{err}");
        let labels = vec![("model".to_owned(), "m".to_owned())];
        let s1 = m.series(&a, None, labels.clone(), None).unwrap();
        let s2 = m.series(&b, None, labels, None).unwrap();
        s1.update("increment", 5.0).unwrap();
        s2.update("increment", 2.5).unwrap();
        assert_eq!(s1.value().unwrap(), 7.5);
        let text = scrape(&m);
        assert!(
            text.contains("# HELP latency_ns first\n# TYPE latency_ns counter\n"),
            "{text}"
        );
        assert!(text.contains("latency_ns{model=\"m\"} 7.5\n"), "{text}");
    }

    #[test]
    fn kinds_allow_only_their_operations() {
        let m = CustomMetrics::default();
        let c = m.family("c", "", MetricKind::Counter).unwrap();
        let c = m.series(&c, None, vec![], None).unwrap();
        assert!(
            c.update("increment", -1.0)
                .unwrap_err()
                .contains("only grows")
        );
        assert!(c.update("set", 1.0).unwrap_err().contains("not set"));
        assert!(
            c.update("increment", f64::NAN)
                .unwrap_err()
                .contains("not a number")
        );
        let g = m.family("g", "", MetricKind::Gauge).unwrap();
        let g = m.series(&g, None, vec![], None).unwrap();
        g.update("set", 4.0).unwrap();
        g.update("increment", -6.0).unwrap();
        assert_eq!(g.value().unwrap(), -2.0);
        let h = m.family("h", "", MetricKind::Histogram).unwrap();
        assert!(
            m.series(&h, None, vec![], None)
                .err()
                .unwrap()
                .contains("needs buckets")
        );
        assert!(
            m.series(&h, None, vec![], Some(vec![2.0, 1.0]))
                .err()
                .unwrap()
                .contains("increasing")
        );
        let hs = m.series(&h, None, vec![], Some(vec![1.0, 10.0])).unwrap();
        for v in [0.5, 3.0, 30.0] {
            hs.update("observe", v).unwrap();
        }
        assert!(hs.value().is_err());
        let text = scrape(&m);
        for line in [
            "h_bucket{le=\"1\"} 1\n",
            "h_bucket{le=\"10\"} 2\n",
            "h_bucket{le=\"+Inf\"} 3\n",
            "h_sum 33.5\n",
            "h_count 3\n",
            "c 0\n",
            "g -2\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn names_and_labels_cannot_break_the_scrape_or_pose_as_the_server() {
        let m = CustomMetrics::default();
        for bad in [
            "",
            "9lives",
            "a b",
            "a\n# TYPE x counter",
            "nv_inference_count",
            "tessera_x",
        ] {
            assert!(m.family(bad, "", MetricKind::Gauge).is_err(), "{bad:?}");
        }
        let f = m.family("ok", "a\nb \\ c", MetricKind::Gauge).unwrap();
        for bad in ["__name__", "le", "a-b", ""] {
            let labels = vec![(bad.to_owned(), "v".to_owned())];
            assert!(m.series(&f, None, labels, None).is_err(), "{bad:?}");
        }
        let forged = vec![("tenant".to_owned(), "other".to_owned())];
        assert!(m.series(&f, Some("t1"), forged.clone(), None).is_err());
        let _operator = m.series(&f, None, forged, None).unwrap();
        let value = vec![("v".to_owned(), "x\"} 1\nevil 2".to_owned())];
        let _s = m.series(&f, Some("t1"), value, None).unwrap();
        let text = scrape(&m);
        assert!(text.contains("# HELP ok a\\nb \\\\ c\n"), "{text}");
        assert!(
            text.contains("ok{tenant=\"t1\",v=\"x\\\"} 1\\nevil 2\"} 0\n"),
            "{text}"
        );
        assert!(!text.lines().any(|l| l.starts_with("evil")), "{text}");
    }

    #[test]
    fn a_keeper_holds_each_series_once_until_it_goes() {
        let m = CustomMetrics::default();
        let keeper = SeriesKeeper::default();
        let f = m.family("kept", "", MetricKind::Counter).unwrap();
        for _ in 0..3 {
            // An invocation: it asks for the series, counts, and ends.
            let s = m.series(&f, None, vec![], None).unwrap();
            keeper.keep(&s);
            s.update("increment", 1.0).unwrap();
        }
        drop(f);
        assert_eq!(lock(&keeper.0).len(), 1);
        assert!(scrape(&m).contains("kept 3\n"));
        drop(keeper);
        assert_eq!(scrape(&m), "", "the function's series left with it");
    }

    #[test]
    fn series_live_while_held_and_owners_are_bounded() {
        let m = CustomMetrics::default();
        let f = m.family("held", "", MetricKind::Gauge).unwrap();
        let s = m.series(&f, Some("t"), vec![], None).unwrap();
        drop(f);
        assert!(scrape(&m).contains("held{tenant=\"t\"} 0"));
        drop(s);
        assert_eq!(scrape(&m), "", "nothing held, nothing shown");
        let f = m.family("many", "", MetricKind::Gauge).unwrap();
        let held: Vec<_> = (0..MAX_SERIES_PER_OWNER)
            .map(|i| {
                m.series(&f, Some("greedy"), vec![("i".into(), i.to_string())], None)
                    .unwrap()
            })
            .collect();
        let refused = m.series(&f, Some("greedy"), vec![("i".into(), "x".into())], None);
        assert!(refused.err().unwrap().contains("its most"));
        // Another tenant is not crowded out.
        assert!(m.series(&f, Some("other"), vec![], None).is_ok());
        drop(held);
        assert!(
            m.series(&f, Some("greedy"), vec![("i".into(), "x".into())], None)
                .is_ok()
        );
    }

    #[test]
    fn a_tenant_cannot_take_every_family_of_the_server() {
        let m = CustomMetrics::default();
        let mut held: Vec<_> = (0..MAX_FAMILIES_PER_TENANT)
            .map(|i| {
                m.family_for(&format!("f{i}"), "", MetricKind::Gauge, Some("greedy"))
                    .unwrap()
            })
            .collect();
        let refused = m
            .family_for("one_more", "", MetricKind::Gauge, Some("greedy"))
            .err()
            .unwrap_or_default();
        assert!(refused.contains("tenant 'greedy' holds 100"), "{refused}");
        // Another tenant, and the operator, still can; a family the tenant lets go frees one.
        assert!(
            m.family_for("theirs", "", MetricKind::Gauge, Some("other"))
                .is_ok()
        );
        assert!(m.family("operators", "", MetricKind::Gauge).is_ok());
        held.pop();
        assert!(
            m.family_for("one_more", "", MetricKind::Gauge, Some("greedy"))
                .is_ok()
        );
    }
}

//! A/B reports: statistics over per-run metrics of two sides (old and new behaviour, or two
//! engines) and their rendering in the two layouts the seed commits use.
//!
//! - LKP (`lkp compare`, lib/compare.rb in lkp-tests): `%stddev  %change  %stddev`; per row the
//!   mean of side A, its relative standard deviation (population, as LKP's
//!   `standard_deviation`) shown as `± N%` only above 2%, the change of the means as a signed
//!   percentage (a zero baseline counts as 1e-100, as LKP does), the mean of side B with its
//!   deviation, and the metric's name. Numbers: `%10.2f` below 1000, `%10.4g` above 1e8, else
//!   `%10d`; changes `%+10.1f%%` (`%+10.2g%%` from 100000%).
//! - mmtests (`compare-kernels.sh` / compare-mmtests.pl, MMTests::Compare and ::Stat): rows
//!   `Stat Operation value ( x.xx%) value ( x.xx%)` for Min, the mean, the standard deviation,
//!   the coefficient of variation and Max. Lower-is-better metrics (times, latencies,
//!   counters) use the arithmetic mean (`Amean`) and `pndiff` = (old - new) / old as the
//!   improvement; higher-is-better metrics (throughput) use the harmonic mean (`Hmean`) and
//!   `pdiff` = (new - old) / old. Stddev and CoeffVar always compare as lower-is-better.
//!   mmtests' special cases are kept: equal values give 0%, a zero baseline 100% (pdiff) or
//!   -99% (pndiff), an undefined statistic (one sample, a non-positive value in a harmonic
//!   mean) prints as 0.00 with 0.00%.
//!
//! Input is generic: every run is a list of named [`Metric`]s with a [`Kind`], so any workload
//! (usemem, dd, simoop's latency percentiles) reports through the same code.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// How to read a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// Higher is better (throughput, rates).
    Throughput,
    /// Lower is better (elapsed time, latency, lock wait).
    Time,
    /// An event count: shown only when it moved by more than the threshold.
    Counter,
}

impl Kind {
    fn higher_is_better(self) -> bool {
        self == Kind::Throughput
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Throughput => "throughput",
            Kind::Time => "time",
            Kind::Counter => "counter",
        }
    }
}

/// A point of a latency distribution (for the percentile chart): series "Read", label "p95",
/// rank 95.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Percentile {
    pub series: String,
    pub label: String,
    pub rank: f64,
}

/// One measured value of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    pub name: String,
    pub kind: Kind,
    pub value: f64,
    pub percentile: Option<Percentile>,
}

impl Metric {
    pub fn new(name: impl Into<String>, kind: Kind, value: f64) -> Metric {
        Metric {
            name: name.into(),
            kind,
            value,
            percentile: None,
        }
    }
}

/// Prefix of per-call-site lock wait counters (`lock_wait_ns.<site>`): always shown, sorted.
pub const LOCK_WAIT_PREFIX: &str = "lock_wait_ns.";

/// One side of a comparison.
#[derive(Debug, Clone)]
pub struct Side {
    /// Column title, e.g. `swapcache_writeback_tags-on`.
    pub label: String,
    pub runs: Vec<Vec<Metric>>,
}

/// Arithmetic mean (0 for no values).
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The median (the mean of the middle two for an even count; 0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Population standard deviation (LKP's `standard_deviation`); None below two values.
pub fn stddev_pop(v: &[f64]) -> Option<f64> {
    (v.len() > 1).then(|| {
        let m = mean(v);
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    })
}

/// Sample standard deviation (mmtests' `calc_stddev` for the arithmetic mean).
pub fn stddev_sample(v: &[f64]) -> Option<f64> {
    (v.len() > 1).then(|| {
        let m = mean(v);
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    })
}

/// Harmonic mean; None when empty or any value is not positive (mmtests' NaN).
pub fn hmean(v: &[f64]) -> Option<f64> {
    if v.is_empty() || v.iter().any(|&x| x <= 0.0) {
        return None;
    }
    Some(v.len() as f64 / v.iter().map(|x| 1.0 / x).sum::<f64>())
}

/// mmtests' standard deviation around the harmonic mean.
fn stddev_h(v: &[f64]) -> Option<f64> {
    let m = hmean(v)?;
    if v.len() <= 1 {
        return None;
    }
    let d: f64 = v.iter().map(|x| (1.0 / x - 1.0 / m).powi(2)).sum();
    Some((d * m.powi(4) / v.len() as f64).sqrt())
}

/// C's `%.{prec}g`.
pub fn fmt_g(v: f64, prec: usize) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if !v.is_finite() {
        return format!("{v}");
    }
    let prec = prec.max(1);
    let sci = format!("{:.*e}", prec - 1, v);
    let (mant, exp) = sci.split_once('e').expect("exponent");
    let x: i32 = exp.parse().expect("exponent digits");
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if x < -4 || x >= prec as i32 {
        format!(
            "{}e{}{:02}",
            strip(mant),
            if x < 0 { '-' } else { '+' },
            x.abs()
        )
    } else {
        strip(&format!("{:.*}", (prec as i32 - 1 - x) as usize, v))
    }
}

/// One metric over both sides.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub kind: Kind,
    pub a: Vec<f64>,
    pub b: Vec<f64>,
}

impl Row {
    /// LKP's change of the means, percent (zero baseline counted as 1e-100).
    pub fn change_pct(&self) -> f64 {
        let a0 = mean(&self.a);
        let a0 = if a0 == 0.0 { 1e-100 } else { a0 };
        100.0 * (mean(&self.b) - a0) / a0
    }

    /// Relative population standard deviation in percent, as LKP computes it (negative means
    /// none).
    fn rel_stddev(v: &[f64]) -> f64 {
        let m = mean(v);
        match stddev_pop(v) {
            None => -1.0,
            Some(s) if m != 0.0 => 100.0 * s / m,
            Some(s) => s,
        }
    }

    /// Whether a counter row moved enough to be shown.
    fn moved(&self, threshold_pct: f64) -> bool {
        let (a, b) = (mean(&self.a), mean(&self.b));
        if a == 0.0 && b == 0.0 {
            return false;
        }
        self.change_pct().abs() > threshold_pct
    }
}

/// The rows of a comparison, in report order: throughput and time metrics as the runs list
/// them, then counters whose means differ by more than `threshold_pct` percent, then the lock
/// wait rows (`lock_wait_ns.*`) sorted by name. Every metric of any run is considered; a run
/// that lacks a metric contributes no value to it.
pub fn rows(a: &Side, b: &Side, threshold_pct: f64) -> Vec<Row> {
    let all = all_rows(a, b);
    let (mut lock, rest): (Vec<Row>, Vec<Row>) = all
        .into_iter()
        .partition(|r| r.name.starts_with(LOCK_WAIT_PREFIX));
    // A call site that never waited on either side is not a profile row.
    lock.retain(|r| r.a.iter().chain(r.b.iter()).any(|&v| v != 0.0));
    lock.sort_by(|x, y| x.name.cmp(&y.name));
    let (counters, main): (Vec<Row>, Vec<Row>) =
        rest.into_iter().partition(|r| r.kind == Kind::Counter);
    main.into_iter()
        .chain(counters.into_iter().filter(|r| r.moved(threshold_pct)))
        .chain(lock)
        .collect()
}

/// Every metric as a row, in first-seen order.
pub fn all_rows(a: &Side, b: &Side) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for (side, runs) in [(0, &a.runs), (1, &b.runs)] {
        for run in runs.iter() {
            for m in run {
                let i = match out.iter().position(|r| r.name == m.name) {
                    Some(i) => i,
                    None => {
                        out.push(Row {
                            name: m.name.clone(),
                            kind: m.kind,
                            a: Vec::new(),
                            b: Vec::new(),
                        });
                        out.len() - 1
                    }
                };
                if side == 0 {
                    out[i].a.push(m.value);
                } else {
                    out[i].b.push(m.value);
                }
            }
        }
    }
    out
}

fn pad10(s: String) -> String {
    format!("{s:>10}")
}

fn lkp_value(avg: f64) -> String {
    if avg.abs() < 1000.0 {
        format!("{avg:10.2}")
    } else if avg.abs() > 100_000_000.0 {
        pad10(fmt_g(avg, 4))
    } else {
        format!("{:10}", avg.trunc() as i64)
    }
}

fn lkp_err(rel: f64) -> String {
    if rel > 2.0 {
        format!(" ±{:3}%", rel.trunc() as i64)
    } else {
        " ".repeat(6)
    }
}

fn lkp_change(p: f64) -> String {
    if p.abs() < 100_000.0 {
        format!("{p:+10.1}%")
    } else {
        let g = fmt_g(p, 2);
        pad10(if p >= 0.0 { format!("+{g}") } else { g }) + "%"
    }
}

/// The LKP table (as in shared/seeds/000): a title line per side, the two header lines, one
/// line per row.
pub fn format_lkp(a_label: &str, b_label: &str, rows: &[Row]) -> String {
    let mut s = String::new();
    s += format!("{a_label:<16} {b_label}").trim_end();
    s += "\n---------------- --------------------------\n";
    s += "         %stddev     %change         %stddev\n";
    s += "             \\          |                \\\n";
    for r in rows {
        let (ma, mb) = (mean(&r.a), mean(&r.b));
        s += &lkp_value(ma);
        s += &lkp_err(Row::rel_stddev(&r.a));
        s += &lkp_change(r.change_pct());
        s += " ";
        s += &lkp_value(mb);
        s += &lkp_err(Row::rel_stddev(&r.b));
        s += "  ";
        s += &r.name;
        s += "\n";
    }
    s
}

/// mmtests' `pdiff(new, base)`: higher is better.
pub fn pdiff(new: f64, base: f64) -> f64 {
    if new == base || new == 0.0 {
        0.0
    } else if base == 0.0 {
        100.0
    } else {
        new * 100.0 / base - 100.0
    }
}

/// mmtests' `pndiff(new, base)`: lower is better, as an improvement.
pub fn pndiff(new: f64, base: f64) -> f64 {
    if new == base {
        0.0
    } else if new == 0.0 {
        100.0
    } else if base == 0.0 {
        -99.0
    } else {
        100.0 - new * 100.0 / base
    }
}

/// The summary statistics mmtests prints per operation (setSummaryMultiops' order).
#[derive(Clone, Copy)]
enum Stat {
    Min,
    Mean,
    Stddev,
    CoeffVar,
    Max,
}

const STATS: [Stat; 5] = [
    Stat::Min,
    Stat::Mean,
    Stat::Stddev,
    Stat::CoeffVar,
    Stat::Max,
];

impl Stat {
    fn name(self, higher: bool) -> &'static str {
        match (self, higher) {
            (Stat::Min, _) => "Min",
            (Stat::Max, _) => "Max",
            (Stat::Mean, false) => "Amean",
            (Stat::Mean, true) => "Hmean",
            (Stat::Stddev, false) => "Stddev",
            (Stat::Stddev, true) => "HStddev",
            (Stat::CoeffVar, false) => "CoeffVar",
            (Stat::CoeffVar, true) => "HCoeffVar",
        }
    }

    /// The statistic, None where mmtests has NaN.
    fn of(self, v: &[f64], higher: bool) -> Option<f64> {
        if v.is_empty() {
            return None;
        }
        let m = if higher { hmean(v) } else { Some(mean(v)) };
        let sd = if higher {
            stddev_h(v)
        } else {
            stddev_sample(v)
        };
        match self {
            Stat::Min => Some(v.iter().copied().fold(f64::INFINITY, f64::min)),
            Stat::Max => Some(v.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
            Stat::Mean => m,
            Stat::Stddev => sd,
            Stat::CoeffVar => {
                let m = m?;
                (m != 0.0).then(|| 100.0 * sd.unwrap_or(0.0) / m)
            }
        }
    }

    /// The comparison of new against base.
    fn compare(self, new: f64, base: f64, higher: bool) -> f64 {
        match self {
            Stat::Stddev | Stat::CoeffVar => pndiff(new, base),
            _ if higher => pdiff(new, base),
            _ => pndiff(new, base),
        }
    }
}

/// Splits a column title into mmtests' two header lines: at its first '-', or after a
/// following `-rcN` (compare.pm's "bodge identification of -rc").
fn split_label(l: &str) -> (&str, &str) {
    let Some(mut i) = l.find('-') else {
        return (l, "");
    };
    let b = l.as_bytes();
    if l[i..].starts_with("-rc") && b.get(i + 3).is_some_and(u8::is_ascii_digit) {
        i += 4;
    }
    if i >= l.len() {
        return (l, "");
    }
    (&l[..i], &l[i + 1..])
}

/// The mmtests compare table (as in shared/seeds/004): two header lines, then for each
/// statistic one line per row: `Stat Operation A ( 0.00%) B ( x.xx%)`.
pub fn format_mmtests(a_label: &str, b_label: &str, rows: &[Row]) -> String {
    const FIELD: usize = 12;
    const CMP: usize = 6;
    let stat_w = rows
        .iter()
        .flat_map(|r| {
            STATS
                .iter()
                .map(move |s| s.name(r.kind.higher_is_better()).len())
        })
        .max()
        .unwrap_or(5);
    let op_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let col = FIELD + CMP + 4;
    let (a1, a2) = split_label(a_label);
    let (b1, b2) = split_label(b_label);
    let mut s = String::new();
    // A title wider than its column keeps one space before it.
    let col_a = col.max(a1.len().max(a2.len()) + 1);
    let col_b = col.max(b1.len().max(b2.len()) + 1);
    for (x, y) in [(a1, b1), (a2, b2)] {
        let line = format!("{:w$}{x:>col_a$}{y:>col_b$}", "", w = stat_w + 1 + op_w);
        s += line.trim_end();
        s += "\n";
    }
    for stat in STATS {
        for r in rows {
            let higher = r.kind.higher_is_better();
            let base = stat.of(&r.a, higher);
            let new = stat.of(&r.b, higher);
            let (va, vb, cmp) = match (base, new) {
                (Some(x), Some(y)) => (x, y, stat.compare(y, x, higher)),
                (Some(x), None) => (x, 0.0, 0.0),
                (None, Some(y)) => (0.0, y, 0.0),
                (None, None) => (0.0, 0.0, 0.0),
            };
            s += &format!(
                "{:<stat_w$} {:<op_w$}{va:>FIELD$.2} ({:>CMP$.2}%){vb:>FIELD$.2} ({cmp:>CMP$.2}%)\n",
                stat.name(higher),
                r.name,
                0.0
            );
        }
    }
    s
}

/// The comparison as JSON: every row (shown or not), with values, means, deviations and
/// both changes.
pub fn to_json(a: &Side, b: &Side, threshold_pct: f64) -> Value {
    let shown: Vec<String> = rows(a, b, threshold_pct)
        .into_iter()
        .map(|r| r.name)
        .collect();
    let side = |v: &[f64]| {
        json!({
            "values": v,
            "mean": mean(v),
            "stddev": stddev_pop(v),
            "stddev_pct": stddev_pop(v).map(|s| if mean(v) != 0.0 { 100.0 * s / mean(v) } else { 0.0 }),
            "hmean": hmean(v),
        })
    };
    let rows: Vec<Value> = all_rows(a, b)
        .iter()
        .map(|r| {
            let higher = r.kind.higher_is_better();
            let (ma, mb) = (mean(&r.a), mean(&r.b));
            json!({
                "metric": r.name,
                "kind": r.kind.name(),
                "a": side(&r.a),
                "b": side(&r.b),
                // Unbounded from a zero baseline: null.
                "change_pct": if ma == 0.0 && mb == 0.0 { Some(0.0) } else if ma == 0.0 { None } else { Some(100.0 * (mb - ma) / ma) },
                "improvement_pct": if higher { pdiff(mb, ma) } else { pndiff(mb, ma) },
                "shown": shown.contains(&r.name),
            })
        })
        .collect();
    json!({
        "a": a.label,
        "b": b.label,
        "runs_a": a.runs.len(),
        "runs_b": b.runs.len(),
        "threshold_pct": threshold_pct,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }

    fn side(label: &str, runs: &[&[(&str, Kind, f64)]]) -> Side {
        Side {
            label: label.into(),
            runs: runs
                .iter()
                .map(|r| r.iter().map(|&(n, k, v)| Metric::new(n, k, v)).collect())
                .collect(),
        }
    }

    #[test]
    fn percent_g_like_c() {
        assert_eq!(fmt_g(0.0424584, 6), "0.0424584");
        assert_eq!(fmt_g(12.0, 6), "12");
        assert_eq!(fmt_g(250_695_200.0, 4), "2.507e+08");
        assert_eq!(fmt_g(5e102, 2), "5e+102");
        assert_eq!(fmt_g(-1.5e-7, 2), "-1.5e-07");
        assert_eq!(fmt_g(123456.0, 2), "1.2e+05");
        assert_eq!(fmt_g(0.0001, 3), "0.0001");
        assert_eq!(fmt_g(0.0, 3), "0");
    }

    /// The seed's own first two rows, reproduced from per-run values with those means and
    /// deviations.
    #[test]
    fn lkp_layout_matches_the_seed() {
        let a = side(
            "base",
            &[
                &[
                    ("vm-scalability.throughput", Kind::Throughput, 2_456_952.0),
                    ("vmstat.swap.so", Kind::Throughput, 1_120_000.0),
                ],
                &[
                    ("vm-scalability.throughput", Kind::Throughput, 2_556_952.0),
                    ("vmstat.swap.so", Kind::Throughput, 1_294_804.0),
                ],
            ],
        );
        let b = side(
            "base+patch",
            &[
                &[
                    ("vm-scalability.throughput", Kind::Throughput, 3_000_000.0),
                    ("vmstat.swap.so", Kind::Throughput, 1_390_000.0),
                ],
                &[
                    ("vm-scalability.throughput", Kind::Throughput, 3_424_152.0),
                    ("vmstat.swap.so", Kind::Throughput, 1_563_156.0),
                ],
            ],
        );
        let got = format_lkp("base", "base+patch", &rows(&a, &b, 2.0));
        let want = "\
base             base+patch
---------------- --------------------------
         %stddev     %change         %stddev
             \\          |                \\
   2506952           +28.1%    3212076 ±  6%  vm-scalability.throughput
   1207402 ±  7%     +22.3%    1476578 ±  5%  vmstat.swap.so
";
        // Side A's throughput deviates 50000/2506952 = 1.99%: hidden (LKP shows only > 2%).
        assert_eq!(got, want);
    }

    #[test]
    fn lkp_small_values_negative_change_and_zero_baseline() {
        let a = side(
            "old",
            &[
                &[
                    ("lock_wait_ns.b_site", Kind::Time, 10.0),
                    ("lock_wait_ns.a_site", Kind::Time, 8.0),
                    ("proc-vmstat.pswpout", Kind::Counter, 0.0),
                    ("proc-vmstat.pgfault", Kind::Counter, 1000.0),
                    ("proc-vmstat.same", Kind::Counter, 500.0),
                ],
                &[
                    ("lock_wait_ns.b_site", Kind::Time, 11.72),
                    ("lock_wait_ns.a_site", Kind::Time, 8.0),
                    ("proc-vmstat.pswpout", Kind::Counter, 0.0),
                    ("proc-vmstat.pgfault", Kind::Counter, 1000.0),
                    ("proc-vmstat.same", Kind::Counter, 505.0),
                ],
            ],
        );
        let b = side(
            "new",
            &[
                &[
                    ("lock_wait_ns.b_site", Kind::Time, 0.0),
                    ("lock_wait_ns.a_site", Kind::Time, 6.0),
                    ("proc-vmstat.pswpout", Kind::Counter, 5.0),
                    ("proc-vmstat.pgfault", Kind::Counter, 970.0),
                    ("proc-vmstat.same", Kind::Counter, 505.0),
                ],
                &[
                    ("lock_wait_ns.b_site", Kind::Time, 0.0),
                    ("lock_wait_ns.a_site", Kind::Time, 6.0),
                    ("proc-vmstat.pswpout", Kind::Counter, 5.0),
                    ("proc-vmstat.pgfault", Kind::Counter, 960.0),
                    ("proc-vmstat.same", Kind::Counter, 500.0),
                ],
            ],
        );
        let got = format_lkp("old", "new", &rows(&a, &b, 2.0));
        let want = "\
old              new
---------------- --------------------------
         %stddev     %change         %stddev
             \\          |                \\
      0.00         +5e+102%       5.00        proc-vmstat.pswpout
      1000            -3.5%     965.00        proc-vmstat.pgfault
      8.00           -25.0%       6.00        lock_wait_ns.a_site
     10.86 ±  7%    -100.0%       0.00        lock_wait_ns.b_site
";
        assert_eq!(got, want);
    }

    #[test]
    fn lkp_large_numbers_use_g() {
        let a = side("a", &[&[("x", Kind::Throughput, 250_695_200.0)]]);
        let b = side("b", &[&[("x", Kind::Throughput, 3e9)]]);
        let got = format_lkp("a", "b", &rows(&a, &b, 2.0));
        assert!(
            got.ends_with(" 2.507e+08         +1096.7%      3e+09        x\n"),
            "{got}"
        );
    }

    #[test]
    fn mmtests_layout_matches_the_seed() {
        // Two runs per side whose means are the seed's p50-Write and p95-Write rows.
        let a = side(
            "4.10.0-rc5-vanilla",
            &[
                &[
                    ("p50-Write", Kind::Time, 1138.04),
                    ("p95-Write", Kind::Time, 1_106_643.48),
                ],
                &[
                    ("p50-Write", Kind::Time, 1138.04),
                    ("p95-Write", Kind::Time, 1_106_643.48),
                ],
            ],
        );
        let b = side(
            "4.10.0-rc5-johannes-v1r1",
            &[
                &[
                    ("p50-Write", Kind::Time, 989.82),
                    ("p95-Write", Kind::Time, 12104.00),
                ],
                &[
                    ("p50-Write", Kind::Time, 989.82),
                    ("p95-Write", Kind::Time, 12104.00),
                ],
            ],
        );
        let got = format_mmtests(&a.label, &b.label, &rows(&a, &b, 2.0));
        let lines: Vec<&str> = got.lines().collect();
        // The operation column is 8 + 1 + 9 wide; each side's header is right-aligned in
        // 12 + 6 + 4 = 22 columns (as in the seed, where it is 8 + 1 + 20 and 22).
        assert_eq!(
            lines[0],
            format!(
                "{}4.10.0-rc5{}4.10.0-rc5",
                " ".repeat(18 + 12),
                " ".repeat(12)
            )
        );
        assert_eq!(
            lines[1],
            format!(
                "{}vanilla{}johannes-v1r1",
                " ".repeat(18 + 15),
                " ".repeat(9)
            )
        );
        assert!(lines.contains(&"Amean    p50-Write     1138.04 (  0.00%)      989.82 ( 13.02%)"));
        assert!(lines.contains(&"Amean    p95-Write  1106643.48 (  0.00%)    12104.00 ( 98.91%)"));
        // Min, Amean, Stddev, CoeffVar, Max for each of the two operations.
        assert_eq!(lines.len(), 2 + 5 * 2);
        assert!(lines[2].starts_with("Min      p50-Write"), "{got}");
        // Identical runs: a zero stddev on both sides compares as 0%.
        assert!(lines.contains(&"Stddev   p50-Write        0.00 (  0.00%)        0.00 (  0.00%)"));
    }

    #[test]
    fn mmtests_throughput_uses_hmean_and_pdiff() {
        let a = side(
            "x-old",
            &[
                &[("tput", Kind::Throughput, 100.0)],
                &[("tput", Kind::Throughput, 300.0)],
            ],
        );
        let b = side(
            "x-new",
            &[
                &[("tput", Kind::Throughput, 150.0)],
                &[("tput", Kind::Throughput, 150.0)],
            ],
        );
        let got = format_mmtests(&a.label, &b.label, &rows(&a, &b, 2.0));
        // Hmean(100, 300) = 150: no change.
        assert!(
            got.contains("Hmean     tput      150.00 (  0.00%)      150.00 (  0.00%)"),
            "{got}"
        );
        // Max 300 -> 150 is -50% for higher-is-better.
        assert!(
            got.contains("Max       tput      300.00 (  0.00%)      150.00 (-50.00%)"),
            "{got}"
        );
        // A non-positive value makes the harmonic mean undefined: printed as 0.00.
        let z = side("x-z", &[&[("tput", Kind::Throughput, 0.0)]]);
        let got = format_mmtests(&z.label, &b.label, &rows(&z, &b, 2.0));
        assert!(
            got.contains("Hmean     tput        0.00 (  0.00%)      150.00 (  0.00%)"),
            "{got}"
        );
    }

    #[test]
    fn mmtests_diffs() {
        assert_eq!(pdiff(120.0, 100.0), 20.0);
        assert_eq!(pdiff(0.0, 100.0), 0.0);
        assert_eq!(pdiff(5.0, 0.0), 100.0);
        assert_eq!(pndiff(80.0, 100.0), 20.0);
        assert_eq!(pndiff(120.0, 100.0), -20.0);
        assert_eq!(pndiff(0.0, 100.0), 100.0);
        assert_eq!(pndiff(5.0, 0.0), -99.0);
        assert_eq!(pndiff(7.0, 7.0), 0.0);
    }

    #[test]
    fn statistics() {
        let v = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&v), 5.0);
        assert_eq!(stddev_pop(&v), Some(2.0));
        assert!((stddev_sample(&v).unwrap() - 2.138).abs() < 1e-3);
        assert_eq!(stddev_pop(&[1.0]), None);
        assert_eq!(hmean(&[1.0, 4.0, 4.0]), Some(2.0));
        assert_eq!(hmean(&[1.0, 0.0]), None);
    }

    #[test]
    fn json_has_every_row_and_marks_shown() {
        let a = side(
            "a",
            &[&[("t", Kind::Throughput, 1.0), ("c", Kind::Counter, 5.0)]],
        );
        let b = side(
            "b",
            &[&[("t", Kind::Throughput, 2.0), ("c", Kind::Counter, 5.0)]],
        );
        let j = to_json(&a, &b, 2.0);
        let rows = j["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["metric"], "t");
        assert_eq!(rows[0]["shown"], true);
        assert_eq!(rows[0]["change_pct"], 100.0);
        assert_eq!(rows[1]["shown"], false);
    }
}

//! `--plot FILE.svg`: the per-run values of an A/B comparison, side by side, and (when the
//! workload reports latency percentiles, like simoop) a percentile chart per series.
//!
//! A small SVG writer of our own: bars, lines, axes and text elements only, so it needs no
//! font files, no system libraries and no rendering crate; the viewer lays out the text.

use std::fmt::Write;

use crate::report::{mean, Metric, Row, Side};

const W: f64 = 960.0;
const PANEL_W: f64 = 470.0;
const PANEL_H: f64 = 230.0;
const PCT_H: f64 = 300.0;
const COLOR_A: &str = "#4477aa";
const COLOR_B: &str = "#ee6677";

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A short label for an axis value: 1.2k, 3.4M, 5G, 0.25.
pub fn short(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let t = if x == x.trunc() || x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    };
    let t = if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        t
    };
    format!("{t}{unit}")
}

/// Round tick step for a range up to `max`: 1, 2 or 5 times a power of ten, about 4 ticks.
pub fn tick_step(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / 4.0;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let k = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    k * p
}

fn text(out: &mut String, x: f64, y: f64, size: u32, anchor: &str, s: &str) {
    let _ = writeln!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}">{}</text>"#,
        esc(s)
    );
}

/// One panel: per run, A's and B's value as adjacent bars; dashed lines at the means.
fn panel(out: &mut String, x0: f64, y0: f64, row: &Row) {
    let n = row.a.len().max(row.b.len()).max(1);
    let max = row
        .a
        .iter()
        .chain(row.b.iter())
        .copied()
        .fold(0.0f64, f64::max);
    let step = tick_step(max);
    let top = (max / step).ceil().max(1.0) * step;
    let (left, right, up, down) = (58.0, 10.0, 28.0, 30.0);
    let (pw, ph) = (PANEL_W - left - right, PANEL_H - up - down);
    let (px, py) = (x0 + left, y0 + up);
    let y_of = |v: f64| py + ph - (v.max(0.0) / top) * ph;
    let _ = writeln!(out, r#"<g class="panel">"#);
    text(out, x0 + PANEL_W / 2.0, y0 + 16.0, 13, "middle", &row.name);
    let mut t = 0.0;
    while t <= top * 1.0001 {
        let y = y_of(t);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#dddddd"/>"##,
            px + pw
        );
        text(out, px - 6.0, y + 4.0, 10, "end", &short(t));
        t += step;
    }
    let slot = pw / n as f64;
    let bw = (slot * 0.38).min(40.0);
    for i in 0..n {
        let cx = px + slot * (i as f64 + 0.5);
        for (vals, color, dx, class) in [
            (&row.a, COLOR_A, -bw, "bar a"),
            (&row.b, COLOR_B, 0.0, "bar b"),
        ] {
            if let Some(&v) = vals.get(i) {
                let y = y_of(v);
                let _ = writeln!(
                    out,
                    r#"<rect class="{class}" x="{:.1}" y="{y:.1}" width="{bw:.1}" height="{:.1}" fill="{color}"><title>run {}: {}</title></rect>"#,
                    cx + dx,
                    (py + ph - y).max(0.0),
                    i + 1,
                    v
                );
            }
        }
        text(out, cx, py + ph + 14.0, 10, "middle", &format!("{}", i + 1));
    }
    for (vals, color) in [(&row.a, COLOR_A), (&row.b, COLOR_B)] {
        if !vals.is_empty() {
            let y = y_of(mean(vals));
            let _ = writeln!(
                out,
                r#"<line class="mean" x1="{px:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-dasharray="4 3"/>"#,
                px + pw
            );
        }
    }
    let _ = writeln!(
        out,
        r##"<rect x="{px:.1}" y="{py:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#888888"/>"##
    );
    text(out, px + pw / 2.0, py + ph + 27.0, 10, "middle", "run");
    let _ = writeln!(out, "</g>");
}

/// The latency percentiles of one series (e.g. "Write"): mean over runs per rank, both sides,
/// on a log scale.
fn percentile_chart(out: &mut String, y0: f64, series: &str, a: &Side, b: &Side) {
    // (rank, label) in rank order; values per side.
    let mut ranks: Vec<(f64, String)> = Vec::new();
    let collect = |s: &Side, ranks: &mut Vec<(f64, String)>| {
        let mut by: Vec<(f64, Vec<f64>)> = Vec::new();
        for run in &s.runs {
            for m in run {
                if let Some(p) = m.percentile.as_ref().filter(|p| p.series == series) {
                    if !ranks.iter().any(|(r, _)| *r == p.rank) {
                        ranks.push((p.rank, p.label.clone()));
                    }
                    match by.iter_mut().find(|(r, _)| *r == p.rank) {
                        Some(e) => e.1.push(m.value),
                        None => by.push((p.rank, vec![m.value])),
                    }
                }
            }
        }
        by
    };
    let va = collect(a, &mut ranks);
    let vb = collect(b, &mut ranks);
    ranks.sort_by(|x, y| x.0.total_cmp(&y.0));
    let all: Vec<f64> = va
        .iter()
        .chain(vb.iter())
        .map(|(_, v)| mean(v))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(0.0f64, f64::max);
    let (lo, hi) = if all.is_empty() {
        (1.0, 10.0)
    } else {
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
        )
    };
    let (left, right, up, down) = (70.0, 20.0, 30.0, 34.0);
    let (pw, ph) = (W - left - right, PCT_H - up - down);
    let (px, py) = (left, y0 + up);
    let y_of = |v: f64| py + ph - (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()) * ph;
    let x_of = |i: usize| px + pw * (i as f64 + 0.5) / ranks.len().max(1) as f64;
    let _ = writeln!(out, r#"<g class="percentiles">"#);
    text(
        out,
        W / 2.0,
        y0 + 18.0,
        13,
        "middle",
        &format!("{series} latency percentiles (mean over runs, log scale)"),
    );
    let mut d = lo;
    while d <= hi * 1.0001 {
        let y = y_of(d);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#dddddd"/>"##,
            px + pw
        );
        text(out, px - 6.0, y + 4.0, 10, "end", &short(d));
        d *= 10.0;
    }
    for (i, (_, label)) in ranks.iter().enumerate() {
        text(out, x_of(i), py + ph + 16.0, 11, "middle", label);
    }
    for (vals, color, class) in [(&va, COLOR_A, "a"), (&vb, COLOR_B, "b")] {
        let pts: Vec<(f64, f64)> = ranks
            .iter()
            .enumerate()
            .filter_map(|(i, (r, _))| {
                vals.iter()
                    .find(|(x, _)| x == r)
                    .map(|(_, v)| (x_of(i), y_of(mean(v))))
            })
            .collect();
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            out,
            r#"<polyline class="pct {class}" points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for (x, y) in pts {
            let _ = writeln!(
                out,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}"/>"#
            );
        }
    }
    let _ = writeln!(
        out,
        r##"<rect x="{px:.1}" y="{py:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#888888"/>"##
    );
    let _ = writeln!(out, "</g>");
}

/// The series that have percentiles, in first-seen order.
fn percentile_series(a: &Side, b: &Side) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for m in a
        .runs
        .iter()
        .chain(b.runs.iter())
        .flatten()
        .filter_map(|m: &Metric| m.percentile.as_ref())
    {
        if !out.contains(&m.series) {
            out.push(m.series.clone());
        }
    }
    out
}

/// The whole chart: a title and legend, one panel per row (two per line), then the percentile
/// charts.
pub fn svg(title: &str, a: &Side, b: &Side, rows: &[Row]) -> String {
    let series = percentile_series(a, b);
    let panel_lines = rows.len().div_ceil(2);
    // The title wraps at "; ".
    let title_lines: Vec<&str> = title.split("; ").collect();
    let legend_y = 24.0 + 18.0 * title_lines.len() as f64;
    let head = legend_y + 24.0;
    let height = head + panel_lines as f64 * PANEL_H + series.len() as f64 * PCT_H + 10.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r##"<rect x="0" y="0" width="{W}" height="{height}" fill="#ffffff"/>"##
    );
    for (i, l) in title_lines.iter().enumerate() {
        text(&mut out, W / 2.0, 22.0 + 18.0 * i as f64, 14, "middle", l);
    }
    let _ = writeln!(out, r#"<g class="legend">"#);
    for (i, (label, color)) in [(&a.label, COLOR_A), (&b.label, COLOR_B)]
        .into_iter()
        .enumerate()
    {
        let x = W / 2.0 - 200.0 + i as f64 * 220.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{color}"/>"#,
            legend_y - 10.0
        );
        text(
            &mut out,
            x + 18.0,
            legend_y + 1.0,
            12,
            "start",
            &format!(
                "{label} ({} runs)",
                if i == 0 { a.runs.len() } else { b.runs.len() }
            ),
        );
    }
    let _ = writeln!(out, "</g>");
    for (i, r) in rows.iter().enumerate() {
        let x0 = 5.0 + (i % 2) as f64 * (PANEL_W + 10.0);
        let y0 = head + (i / 2) as f64 * PANEL_H;
        panel(&mut out, x0, y0, r);
    }
    for (i, s) in series.iter().enumerate() {
        let y0 = head + panel_lines as f64 * PANEL_H + i as f64 * PCT_H;
        percentile_chart(&mut out, y0, s, a, b);
    }
    out += "</svg>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{rows, Kind, Metric, Percentile};

    fn side(label: &str, runs: usize, base: f64, pct: bool) -> Side {
        Side {
            label: label.into(),
            runs: (0..runs)
                .map(|i| {
                    let mut v = vec![
                        Metric::new("throughput", Kind::Throughput, base + i as f64),
                        Metric::new("elapsed <s>", Kind::Time, 2.0),
                    ];
                    if pct {
                        for (rank, label, x) in [(50.0, "p50", 10.0), (99.0, "p99", 1000.0)] {
                            v.push(Metric {
                                name: format!("{label}-Write"),
                                kind: Kind::Time,
                                value: x * base,
                                percentile: Some(Percentile {
                                    series: "Write".into(),
                                    label: label.into(),
                                    rank,
                                }),
                            });
                        }
                    }
                    v
                })
                .collect(),
        }
    }

    fn balanced(s: &str, open: &str, close: &str) -> bool {
        s.matches(open).count() == s.matches(close).count()
    }

    #[test]
    fn bars_per_run_and_side() {
        let (a, b) = (
            side("sw-old", 3, 100.0, false),
            side("sw-new", 3, 120.0, false),
        );
        let r = rows(&a, &b, 2.0);
        let s = svg("compare & test", &a, &b, &r);
        assert!(s.starts_with("<svg ") && s.ends_with("</svg>\n"));
        assert_eq!(s.matches(r#"class="bar a""#).count(), 3 * r.len());
        assert_eq!(s.matches(r#"class="bar b""#).count(), 3 * r.len());
        assert_eq!(s.matches(r#"class="panel""#).count(), r.len());
        assert_eq!(s.matches(r#"class="mean""#).count(), 2 * r.len());
        assert!(s.contains("compare &amp; test") && s.contains("elapsed &lt;s&gt;"));
        assert!(s.contains("sw-old (3 runs)") && s.contains("sw-new (3 runs)"));
        assert!(!s.contains("percentiles"));
        assert!(balanced(&s, "<g", "</g>") && balanced(&s, "<text", "</text>"));
    }

    #[test]
    fn percentile_chart_when_the_workload_has_percentiles() {
        let (a, b) = (side("x-old", 2, 1.0, true), side("x-new", 2, 2.0, true));
        let r = rows(&a, &b, 2.0);
        let s = svg("simoop", &a, &b, &r);
        assert_eq!(s.matches(r#"class="percentiles""#).count(), 1);
        assert_eq!(s.matches(r#"class="pct a""#).count(), 1);
        assert!(s.contains("Write latency percentiles"));
        assert!(s.contains(">p50<") && s.contains(">p99<"));
        if let Ok(p) = std::env::var("USERMM_PLOT_SAMPLE") {
            std::fs::write(p, &s).unwrap();
        }
        assert!(balanced(&s, "<g", "</g>"));
    }

    #[test]
    fn ticks_and_labels() {
        assert_eq!(tick_step(1000.0), 500.0);
        assert_eq!(tick_step(8.0), 2.0);
        assert_eq!(tick_step(100.0), 50.0);
        assert_eq!(tick_step(0.0), 1.0);
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(2_000_000.0), "2M");
        assert_eq!(short(0.25), "0.25");
        assert_eq!(short(12.5), "12.5");
    }
}

//! The chart: two panels side by side, req/s and p99 latency against concurrency, one
//! polyline per target in each, as a small self-contained SVG written by hand.

use std::fmt::Write;

use super::load::{Run, TargetResult};
use super::BenchArgs;

const WIDTH: f64 = 860.0;
/// Height without the legend, which takes [`LEGEND_LINE`] per target.
const HEIGHT: f64 = 340.0;
const LEGEND_LINE: f64 = 16.0;
/// Left edge, width and top of each panel's plot area.
const PANEL_LEFT: [f64; 2] = [70.0, 500.0];
const PANEL_WIDTH: f64 = 330.0;
const PLOT_TOP: f64 = 50.0;
const PLOT_HEIGHT: f64 = 230.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// The whole SVG document.
pub(super) fn chart(args: &BenchArgs, results: &[TargetResult]) -> String {
    let mut s = String::new();
    let height = HEIGHT + LEGEND_LINE * results.len() as f64;
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(
        s,
        "<rect width=\"{WIDTH}\" height=\"{height}\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
        WIDTH / 2.0,
        escape(&format!(
            "corral bench: {} {} {}",
            args.protocol.name(),
            args.method,
            args.path
        ))
    );
    let levels = &args.concurrency;
    panel(&mut s, 0, "requests per second", levels, results, Run::rate);
    panel(
        &mut s,
        1,
        "p99 latency (microseconds)",
        levels,
        results,
        |r| r.latency.value_at_quantile(0.99) as f64,
    );
    for (i, target) in results.iter().enumerate() {
        let y = PLOT_TOP + PLOT_HEIGHT + 58.0 + LEGEND_LINE * i as f64;
        let colour = colour(i);
        let _ = writeln!(
            s,
            "<line x1=\"{a}\" y1=\"{y}\" x2=\"{b}\" y2=\"{y}\" stroke=\"{colour}\" \
             stroke-width=\"2\"/><text x=\"{t}\" y=\"{ty}\">{}</text>",
            escape(&target.label),
            a = PANEL_LEFT[0],
            b = PANEL_LEFT[0] + 24.0,
            t = PANEL_LEFT[0] + 30.0,
            ty = y + 4.0,
        );
    }
    s.push_str("</svg>\n");
    s
}

fn colour(i: usize) -> &'static str {
    COLOURS.get(i % COLOURS.len()).copied().unwrap_or("black")
}

/// One panel: axes, ticks, and one polyline (with dots) per target.
fn panel(
    s: &mut String,
    index: usize,
    title: &str,
    levels: &[usize],
    results: &[TargetResult],
    value: impl Fn(&Run) -> f64,
) {
    let left = PANEL_LEFT.get(index).copied().unwrap_or(0.0);
    let bottom = PLOT_TOP + PLOT_HEIGHT;
    let max = results
        .iter()
        .flat_map(|t| t.runs.iter().map(&value))
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let x_of = |k: usize| {
        if levels.len() <= 1 {
            left + PANEL_WIDTH / 2.0
        } else {
            left + PANEL_WIDTH * k as f64 / (levels.len() - 1) as f64
        }
    };
    let y_of = |v: f64| bottom - PLOT_HEIGHT * (v.max(0.0) / top);
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <path d=\"M{left} {PLOT_TOP} V{bottom} H{}\" fill=\"none\" stroke=\"#444\"/>",
        left + PANEL_WIDTH / 2.0,
        PLOT_TOP - 10.0,
        escape(title),
        left + PANEL_WIDTH
    );
    for step in 0..=4 {
        let v = top * f64::from(step) / 4.0;
        let y = y_of(v);
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
            left + PANEL_WIDTH,
            left - 4.0,
            y + 4.0
        );
    }
    for (k, c) in levels.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{c}</text>",
            x_of(k),
            bottom + 16.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">concurrency</text>",
        left + PANEL_WIDTH / 2.0,
        bottom + 32.0
    );
    for (i, target) in results.iter().enumerate() {
        let points: Vec<(f64, f64)> = target
            .runs
            .iter()
            .enumerate()
            .map(|(k, run)| (x_of(k), y_of(value(run))))
            .collect();
        let colour = colour(i);
        let list: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            list.join(" ")
        );
        for (x, y) in points {
            let _ = writeln!(
                s,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{colour}\"/>"
            );
        }
    }
}

/// Text safe inside an XML element or attribute.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

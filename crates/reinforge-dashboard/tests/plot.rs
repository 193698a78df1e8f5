//! `reinforge plot`'s figures read back: the PNG decodes at the asked size and shows every
//! run's line in its colour; the SVG parses and has one line per (metric, run); a metric no
//! run logged is one error that writes nothing.

use std::path::{Path, PathBuf};

use reinforge_dashboard::plot::{plot, PlotOptions, XAxis};
use reinforge_dashboard::Run;

/// A run directory whose metrics.jsonl has `steps` rows of two metrics (and a validation row
/// without them, as real runs have).
fn run(root: &Path, name: &str, steps: usize, offset: f64) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = String::from("{\"step\":0,\"timestamp\":100.0,\"val/reward/mean\":0.0}\n");
    for s in 1..=steps {
        let x = s as f64;
        text += &format!(
            "{{\"step\":{s},\"timestamp\":{},\"critic/score/mean\":{},\"actor/entropy\":{}}}\n",
            100.0 + 30.0 * x,
            offset + x / steps as f64,
            2.0 - x / steps as f64 + offset
        );
    }
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
    dir
}

fn opts(metrics: &[&str]) -> PlotOptions {
    PlotOptions { metrics: metrics.iter().map(|m| m.to_string()).collect(), x: XAxis::Step, smooth: 0.0, width: 640, panel_height: 240 }
}

#[test]
fn the_png_has_its_size_and_every_runs_line() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = Run::from_dirs(&[run(tmp.path(), "a", 20, 0.0), run(tmp.path(), "b", 20, 0.3)]);
    let out = tmp.path().join("curves.png");
    plot(&runs, &opts(&["critic/score/mean", "actor/entropy"]), &out).unwrap();
    let img = image::open(&out).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (640, 480), "width × (panel height × metrics)");
    let count = |rgb: [u8; 3]| img.pixels().filter(|p| p.0 == rgb).count();
    let not_white = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    assert!(not_white > 640 * 480 / 50, "a blank figure: {not_white} coloured pixels");
    // The first two colours of the palette: run a's and run b's lines (2 px wide, two panels).
    for (run, rgb) in [("a", [0x2b, 0x6c, 0xb0]), ("b", [0xc0, 0x56, 0x21])] {
        assert!(count(rgb) > 400, "run {run}'s line ({rgb:?}) is missing: {} pixels", count(rgb));
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(left.iter().all(|n| !n.contains(".tmp")), "no temporary file left: {left:?}");
}

#[test]
fn the_svg_parses_and_has_one_line_per_series() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = Run::from_dirs(&[run(tmp.path(), "a", 12, 0.0), run(tmp.path(), "b", 12, 0.3), run(tmp.path(), "c", 12, 0.6)]);
    let out = tmp.path().join("curves.svg");
    let mut o = opts(&["critic/score/mean", "actor/entropy"]);
    o.x = XAxis::Time;
    o.smooth = 0.5;
    plot(&runs, &o, &out).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG parses");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert_eq!(doc.root_element().attribute("height"), Some("480"));
    // A series is a 2 px polyline through all its points; the legend's samples are 2 points.
    let series: Vec<(String, usize)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .map(|n| (n.attribute("stroke").unwrap_or("").to_string(), n.attribute("points").unwrap_or("").split_whitespace().count()))
        .filter(|(_, pts)| *pts > 2)
        .collect();
    assert_eq!(series.len(), 2 * 3, "one line per metric and run: {series:?}");
    assert!(series.iter().all(|(_, pts)| *pts == 12), "every step is a point: {series:?}");
    let colours: std::collections::BTreeSet<&str> = series.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(colours.len(), 3, "each run its own colour: {series:?}");
    for name in ["a", "b", "c", "critic/score/mean", "actor/entropy", "minutes"] {
        assert!(doc.descendants().any(|n| n.has_tag_name("text") && n.text().map(str::trim) == Some(name)), "no label {name:?}");
    }
}

#[test]
fn an_unlogged_metric_is_one_error_and_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = Run::from_dirs(&[run(tmp.path(), "a", 5, 0.0)]);
    let out = tmp.path().join("curves.png");
    let e = plot(&runs, &opts(&["critic/score/mean", "actor/entorpy"]), &out).unwrap_err().to_string();
    assert!(e.contains("no values of `actor/entorpy`") && e.contains("a/metrics.jsonl") && !e.contains('\n'), "{e}");
    let e = plot(&runs, &opts(&["critic/score/mean"]), &tmp.path().join("curves.jpg")).unwrap_err().to_string();
    assert!(e.contains("name a .png or .svg file"), "{e}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "only the run directory: nothing written");
}

use super::*;

const PAGE: &str = "\
pool:                 php
process manager:      static
start time:           30/Nov/2026:08:00:11 +0000
start since:          75
accepted conn:        100
listen queue:         1
max listen queue:     3
idle processes:       0
active processes:     2
total processes:      2
in flight:            2
backend errors:       1
recycled:             4
crashes:              0

************************
worker:               1
pid:                  4242
state:                Busy
start since:          70
requests:             60
in flight:            1
memory:               20971520
recycle:              -

************************
worker:               2
pid:                  4243
state:                Idle
requests:             40

pool:                 ext
process manager:      external
accepted conn:        7

************************
server:               0
address:              127.0.0.1:9000
state:                Idle
requests:             7
";

#[test]
fn the_text_page_is_read_into_pools_and_rows() {
    let pools = parse_text(PAGE);
    assert_eq!(pools.len(), 2);
    assert_eq!(pools[0].name(), "php");
    assert_eq!(pools[0].int("accepted conn"), Some(100));
    assert_eq!(
        pools[0].get("start time"),
        Some("30/Nov/2026:08:00:11 +0000")
    );
    assert_eq!(pools[0].rows.len(), 2);
    assert_eq!(field(&pools[0].rows[0], "pid"), Some("4242"));
    assert_eq!(field(&pools[1].rows[0], "address"), Some("127.0.0.1:9000"));
    // Garbage is skipped, never a panic.
    assert!(parse_text("****\nno colon\n:\n\u{0}").is_empty());
}

#[test]
fn histograms_are_read_from_the_metrics() {
    let metrics = "# TYPE corral_request_seconds histogram\n\
            corral_request_seconds_bucket{pool=\"php\",le=\"0.01\"} 3\n\
            corral_request_seconds_bucket{pool=\"php\",le=\"0.1\"} 9\n\
            corral_request_seconds_bucket{pool=\"php\",le=\"+Inf\"} 10\n\
            corral_request_seconds_count{pool=\"php\"} 10\n\
            corral_request_seconds_bucket{pool=\"a\\\"b\",le=\"+Inf\"} 0\n\
            corral_request_seconds_bucket{pool=\"bad\",le=\"x\"} 1\n\
            corral_request_seconds_bucket{pool=\"bad\",le=\"+Inf\"} 1\n\
            corral_request_seconds_bucket{pool=\"cut\n\
            # EOF\n";
    let h = parse_latency(metrics);
    assert_eq!(
        h,
        vec![
            ("php".to_owned(), vec![0.01, 0.1], vec![3, 9, 10]),
            ("a\"b".to_owned(), vec![], vec![0]),
            ("bad".to_owned(), vec![], vec![1]),
        ]
    );
}

#[test]
fn a_frame_shows_rates_and_percentiles_of_the_interval() {
    let t0 = Instant::now();
    let mut before = parse_text(PAGE);
    before[0].latency = Some((vec![0.01, 0.1], vec![0, 0, 0]));
    let mut after =
        parse_text(&PAGE.replace("accepted conn:        100", "accepted conn:        150"));
    after[0].latency = Some((vec![0.01, 0.1], vec![50, 100, 100]));
    let prev = Snapshot {
        at: t0,
        pools: before,
    };
    let now = Snapshot {
        at: t0 + Duration::from_secs(2),
        pools: after,
    };
    let lines = frame(
        &now,
        Some(&prev),
        "127.0.0.1:9180",
        Duration::from_secs(1),
        UNIX_EPOCH + Duration::from_secs(3723),
        None,
    );
    let text = lines.join("\n");
    assert!(lines[0].contains("127.0.0.1:9180") && lines[0].contains("01:02:03 UTC"));
    assert!(lines[0].contains("up 1m15s"), "{}", lines[0]);
    let row = lines.iter().find(|l| l.starts_with("php ")).unwrap();
    // 50 requests in 2 s; half under 10 ms, all under 100 ms.
    assert!(row.contains(" 25.0 "), "{row}");
    assert!(row.contains("10.0 ms"), "{row}");
    assert!(row.contains("98.2 ms"), "{row}");
    assert!(text.contains("php: 2 workers"), "{text}");
    assert!(text.contains("4242") && text.contains("20.0 MiB"), "{text}");
    assert!(text.contains("ext: 1 server") && text.contains("127.0.0.1:9000"));
    // Without a previous fetch there is no rate yet.
    let first = frame(&now, None, "x", Duration::from_secs(1), UNIX_EPOCH, None);
    let row = first.iter().find(|l| l.starts_with("php ")).unwrap();
    assert!(!row.contains("25.0"), "{row}");
}

#[test]
fn frames_fit_the_terminal() {
    let lines: Vec<String> = (0..10).map(|i| format!("line {i} é and more")).collect();
    let fitted = fit(&lines, 8, 4);
    assert_eq!(fitted.len(), 4);
    assert_eq!(fitted[0], "line 0 é");
    assert!(fitted[3].starts_with("… 7 more"));
    assert_eq!(fit(&lines, 100, 10).len(), 10);
}

#[test]
fn plain_output_has_no_escapes() {
    let mut out = Vec::new();
    draw(&mut out, &["a".to_owned(), "b".to_owned()], false).unwrap();
    assert_eq!(out, b"a\nb\n\n");
}

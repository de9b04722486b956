//! `--compare-paper`: the paper's headline figures beside ours.
//!
//! The paper's numbers come from RR-Compound §V (a 100 Gb/s ConnectX-5 cluster, 40-core nodes);
//! ours from this machine's run on the shm provider, so the ratio compares different hardware
//! and is context, not a verdict.

use std::fmt::Write as _;

use crate::plot::TableFile;

/// One headline figure and where our counterpart lives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Headline {
    /// What is measured.
    pub(crate) what: &'static str,
    /// Where in the paper.
    pub(crate) source: &'static str,
    /// The paper's value.
    pub(crate) paper: f64,
    /// Unit of both values.
    pub(crate) unit: &'static str,
    /// Our suite and experiment.
    pub(crate) suite: &'static str,
    pub(crate) experiment: &'static str,
    /// Row filter: (column, value) pairs that must all match (values compared as text).
    pub(crate) filter: &'static [(&'static str, &'static str)],
    /// Our column holding the value.
    pub(crate) column: &'static str,
}

/// The paper's headline figures.
pub(crate) const HEADLINES: &[Headline] = &[
    Headline {
        what: "ping-pong 64 B/8 B median latency",
        source: "Table III",
        paper: 7.22,
        unit: "us",
        suite: "rpc",
        experiment: "pingpong_latency",
        filter: &[("transport", "rrpc-shm-fast")],
        column: "p50_us",
    },
    Headline {
        what: "ping-pong 64 B/8 B p99 latency",
        source: "Table III",
        paper: 7.33,
        unit: "us",
        suite: "rpc",
        experiment: "pingpong_latency",
        filter: &[("transport", "rrpc-shm-fast")],
        column: "p99_us",
    },
    Headline {
        what: "small-RPC throughput, 1 client",
        source: "Fig. 10 (a)",
        paper: 242.0,
        unit: "K RPC/s",
        suite: "rpc",
        experiment: "small_rpc_throughput",
        filter: &[("transport", "rrpc-shm-fast"), ("clients", "1")],
        column: "krps",
    },
    Headline {
        what: "small-RPC throughput, 8 clients",
        source: "Fig. 10 (a)",
        paper: 1550.0,
        unit: "K RPC/s",
        suite: "rpc",
        experiment: "small_rpc_throughput",
        filter: &[("transport", "rrpc-shm-fast"), ("clients", "8")],
        column: "krps",
    },
    Headline {
        what: "ping-pong median latency, tonic baseline",
        source: "Table III (mRPC row: 10.16)",
        paper: 10.16,
        unit: "us",
        suite: "rpc",
        experiment: "pingpong_latency",
        filter: &[("transport", "tonic-tcp")],
        column: "p50_us",
    },
    Headline {
        what: "4 KiB RPCs, BPEV, 4 clients",
        source: "Fig. 8 (a)",
        paper: 120.0,
        unit: "K RPC/s",
        suite: "rpc",
        experiment: "connmgmt_4k_continuous",
        filter: &[("mode", "bpev"), ("clients", "4")],
        column: "krps",
    },
    Headline {
        what: "4 KiB RPCs, BPEV, 32 clients",
        source: "Fig. 8 (a)",
        paper: 620.0,
        unit: "K RPC/s",
        suite: "rpc",
        experiment: "connmgmt_4k_continuous",
        filter: &[("mode", "bpev"), ("clients", "32")],
        column: "krps",
    },
    Headline {
        what: "8 KiB RPC bandwidth, 32 KiB ring",
        source: "Fig. 12",
        paper: 8.1,
        unit: "Gb/s",
        suite: "rpc",
        experiment: "ring_size_bandwidth",
        filter: &[("rpc", "8 KiB"), ("ring_kib", "32")],
        column: "gbps",
    },
    Headline {
        what: "128 KiB RPC bandwidth, 32 KiB ring",
        source: "Fig. 12",
        paper: 16.2,
        unit: "Gb/s",
        suite: "rpc",
        experiment: "ring_size_bandwidth",
        filter: &[("rpc", "128 KiB"), ("ring_kib", "32")],
        column: "gbps",
    },
    Headline {
        what: "64 KiB payload bandwidth, zero-copy on",
        source: "Fig. 14 (≈36; off ≈32)",
        paper: 36.0,
        unit: "Gb/s",
        suite: "rpc",
        experiment: "zero_copy_bandwidth",
        filter: &[("payload_kib", "64"), ("zero_copy", "on")],
        column: "gbps",
    },
    Headline {
        what: "server CPU under low load, 1 client",
        source: "Fig. 16 (a): 200 % (two polling threads)",
        paper: 200.0,
        unit: "% of a core",
        suite: "rpc",
        experiment: "resources_low",
        filter: &[("transport", "rrpc-shm-fast"), ("clients", "1")],
        column: "server_cpu_pct",
    },
    Headline {
        what: "1 MiB WRITE bandwidth",
        source: "§V testbed: 100 Gb/s NIC = 11.6 GiB/s",
        paper: 11.64,
        unit: "GiB/s",
        suite: "fabric",
        experiment: "write_throughput",
        filter: &[("size_B", "1048576")],
        column: "gib_s",
    },
];

fn cell_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Our value for a headline, if the run measured it.
pub(crate) fn ours(h: &Headline, tables: &[&TableFile]) -> Option<f64> {
    let t = tables
        .iter()
        .find(|t| t.suite == h.suite && t.experiment == h.experiment)?;
    let col = t.column(h.column)?;
    let filters: Vec<(usize, &str)> = h
        .filter
        .iter()
        .map(|(c, v)| t.column(c).map(|i| (i, *v)))
        .collect::<Option<_>>()?;
    t.rows
        .iter()
        .find(|row| filters.iter().all(|(i, v)| cell_text(&row[*i]) == *v))
        .and_then(|row| row[col].as_f64())
}

/// The Markdown comparison table.
pub(crate) fn compare(tables: &[&TableFile]) -> String {
    let quick = tables.iter().any(|t| t.quick);
    let mut s = String::from("## Paper headline figures beside ours\n\n");
    s.push_str(
        "**Different hardware:** the paper ran on 100 Gb/s ConnectX-5 RDMA NICs and 40-core \
         Xeon nodes; we run on this machine with the shm provider (no NIC). Ratios are context, \
         not a reproduction claim.\n\n",
    );
    if quick {
        s.push_str("**This was a --quick run: our numbers are smoke-test numbers.**\n\n");
    }
    s.push_str("| figure | source | paper | ours | unit | ours/paper |\n| --- | --- | ---: | ---: | --- | ---: |\n");
    for h in HEADLINES {
        let (o, r) = match ours(h, tables) {
            Some(v) => (format!("{v:.2}"), format!("{:.2}x", v / h.paper)),
            None => ("not measured".to_owned(), "-".to_owned()),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {o} | {} | {r} |",
            h.what, h.source, h.paper, h.unit
        );
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_our_value_by_filter() {
        let t: TableFile = serde_json::from_value(json!({
            "suite": "rpc", "machine": {}, "experiment": "pingpong_latency", "title": "x",
            "columns": ["transport", "p50_us", "p99_us"],
            "rows": [["tonic-tcp", 40.0, 80.0], ["rrpc-shm-fast", 3.61, 9.0]],
            "plot": null
        }))
        .unwrap();
        assert_eq!(ours(&HEADLINES[0], &[&t]), Some(3.61));
        let md = compare(&[&t]);
        assert!(
            md.contains(
                "| ping-pong 64 B/8 B median latency | Table III | 7.22 | 3.61 | us | 0.50x |"
            ),
            "{md}"
        );
        assert!(md.contains("not measured"));
        assert!(md.contains("Different hardware"));
    }
}

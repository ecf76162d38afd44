//! The Prometheus text format (0.0.4) of one scrape, encoded by
//! `prometheus-client`: the agent keeps its values in plain atomics (many
//! are totals read from the kernel and set, not counted here), copies them
//! into [`Family`] rows at scrape time, and the library writes the text.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Whether a family only goes up or is a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Counter,
    Gauge,
}

/// One metric family of a scrape.
#[derive(Debug, Clone)]
pub(super) struct Family {
    /// The exposed name (counters end in `_total`).
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// The one label of a labelled family, and its values.
    pub values: Values,
}

/// A family's samples.
#[derive(Debug, Clone)]
pub(super) enum Values {
    /// One unlabelled sample.
    One(u64),
    /// One sample per value of `label`.
    ByLabel {
        label: &'static str,
        values: Vec<(&'static str, u64)>,
    },
}

impl Family {
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Family {
        Family {
            name,
            help,
            kind: Kind::Counter,
            values: Values::One(value),
        }
    }

    pub fn gauge(name: &'static str, help: &'static str, value: u64) -> Family {
        Family {
            name,
            help,
            kind: Kind::Gauge,
            values: Values::One(value),
        }
    }

    pub fn counters_by(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: Vec<(&'static str, u64)>,
    ) -> Family {
        Family {
            name,
            help,
            kind: Kind::Counter,
            values: Values::ByLabel { label, values },
        }
    }
}

#[derive(Debug)]
struct Scrape(Vec<Family>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            let (name, metric_type) = match family.kind {
                // The library appends `_total` to counter names itself.
                Kind::Counter => (
                    family.name.strip_suffix("_total").unwrap_or(family.name),
                    MetricType::Counter,
                ),
                Kind::Gauge => (family.name, MetricType::Gauge),
            };
            let mut metric = encoder.encode_descriptor(name, family.help, None, metric_type)?;
            match &family.values {
                Values::One(value) => encode_value(family.kind, *value, metric)?,
                Values::ByLabel { label, values } => {
                    for (key, value) in values {
                        let labels = [(*label, *key)];
                        encode_value(family.kind, *value, metric.encode_family(&labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn encode_value(kind: Kind, value: u64, target: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
    match kind {
        Kind::Counter => ConstCounter::new(value).encode(target),
        Kind::Gauge => ConstGauge::new(value).encode(target),
    }
}

/// The text of `families`, in order.
pub(super) fn render(families: Vec<Family>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(families)));
    let mut out = String::with_capacity(4096);
    // Writing into a String never fails, and the families are well formed.
    if let Err(error) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        tracing::error!(%error, "encoding the metrics failed");
    }
    out
}

/// The `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

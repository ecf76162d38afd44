//! The pprof endpoints of this node's pods (pure): from the containers
//! discovery selected, whose targets ask for `pprofScrape`, and the pod IPs
//! the runtime reported. Only pods on this node are ever seen, and only
//! their own IP is scraped, so the cost grows with nodes, not with one
//! agent.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use kiln_cri::SelectedContainer;

use super::ScrapeEndpoint;

/// The endpoints of `selected` whose pod IP `ips` (by sandbox id) holds,
/// and the sandbox ids still without one. Containers of one pod share its
/// network, so one pod's port and path is scraped once, labelled as the
/// first of its containers (by container id) asking for it.
pub fn pod_endpoints(
    selected: &[SelectedContainer],
    ips: &HashMap<String, IpAddr>,
) -> (Vec<ScrapeEndpoint>, BTreeSet<String>) {
    let mut ordered: Vec<&SelectedContainer> = selected
        .iter()
        .filter(|c| c.pprof_scrape.is_some())
        .collect();
    ordered.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    let mut endpoints = Vec::new();
    let mut missing = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for container in ordered {
        let Some(scrape) = &container.pprof_scrape else {
            continue;
        };
        let Some(&ip) = ips.get(&container.sandbox_id) else {
            missing.insert(container.sandbox_id.clone());
            continue;
        };
        let id = format!(
            "{}:{}{}",
            container.sandbox_id, scrape.port, scrape.path_prefix
        );
        if !seen.insert(id.clone()) {
            continue;
        }
        endpoints.push(ScrapeEndpoint {
            id,
            urls: scrape
                .profiles
                .iter()
                .map(|&profile| (profile, scrape.url(ip, profile)))
                .collect(),
            labels: container.labels.clone(),
            interval: Duration::from_secs(u64::from(scrape.interval_seconds)),
            timeout: Duration::from_secs(u64::from(scrape.timeout_seconds)),
        });
    }
    (endpoints, missing)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kiln_targets::{PprofProfile, PprofScrape};

    use super::*;

    fn container(id: &str, sandbox: &str, scrape: bool) -> SelectedContainer {
        SelectedContainer {
            container_id: id.to_owned(),
            cgroup_id: 1,
            sampling_hz: None,
            labels: BTreeMap::from([("container".to_owned(), id.to_owned())]),
            sandbox_id: sandbox.to_owned(),
            pprof_scrape: scrape.then(|| PprofScrape {
                port: 6060,
                path_prefix: "/debug/pprof".to_owned(),
                profiles: vec![PprofProfile::Heap, PprofProfile::Allocs],
                interval_seconds: 15,
                timeout_seconds: 5,
            }),
        }
    }

    #[test]
    fn each_pods_endpoint_once_over_its_ip_and_pods_without_one_named() {
        let selected = [
            container("c2", "s1", true),
            container("c1", "s1", true),
            container("c3", "s2", true),
            container("c4", "s3", false),
        ];
        let ips = HashMap::from([("s1".to_owned(), "10.1.2.3".parse().expect("ip"))]);
        let (endpoints, missing) = pod_endpoints(&selected, &ips);
        assert_eq!(endpoints.len(), 1);
        let endpoint = &endpoints[0];
        assert_eq!(endpoint.labels["container"], "c1");
        assert_eq!(
            endpoint.urls,
            [
                (
                    PprofProfile::Heap,
                    "http://10.1.2.3:6060/debug/pprof/heap".to_owned()
                ),
                (
                    PprofProfile::Allocs,
                    "http://10.1.2.3:6060/debug/pprof/allocs".to_owned()
                ),
            ]
        );
        assert_eq!(
            (endpoint.interval, endpoint.timeout),
            (Duration::from_secs(15), Duration::from_secs(5))
        );
        assert_eq!(missing, BTreeSet::from(["s2".to_owned()]));
    }
}

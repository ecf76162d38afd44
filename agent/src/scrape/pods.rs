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
/// first of its containers (by container id) asking for it. A port given
/// by name is resolved against the pod's declared ports; a name none
/// declares gives an endpoint with `missing_port` set and no URL.
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
        let port = scrape.port.resolve(
            container
                .pod_ports
                .iter()
                .map(|(name, number)| (name.as_str(), *number)),
        );
        endpoints.push(ScrapeEndpoint {
            id,
            urls: scrape
                .profiles
                .iter()
                .map(|&profile| {
                    let url = port.map_or_else(String::new, |port| scrape.url(ip, port, profile));
                    (profile, url)
                })
                .collect(),
            missing_port: port.is_none().then(|| scrape.port.to_string()),
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

    use kiln_targets::{PprofPort, PprofProfile, PprofScrape};

    use super::*;

    fn container(id: &str, sandbox: &str, scrape: bool) -> SelectedContainer {
        SelectedContainer {
            container_id: id.to_owned(),
            cgroup_id: 1,
            sampling_hz: None,
            labels: BTreeMap::from([("container".to_owned(), id.to_owned())]),
            sandbox_id: sandbox.to_owned(),
            pod_ports: Vec::new(),
            pprof_scrape: scrape.then(|| PprofScrape {
                port: PprofPort::Number(6060),
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

    /// A named port is scraped on the number the pod declares for it; a name the pod does not
    /// declare is never scraped, on any port.
    #[test]
    fn a_port_name_resolves_per_pod_or_marks_the_endpoint_missing() {
        let named = |id: &str, sandbox: &str, ports: &[(&str, u16)]| {
            let mut c = container(id, sandbox, true);
            if let Some(scrape) = c.pprof_scrape.as_mut() {
                scrape.port = PprofPort::Name("http-debug".to_owned());
            }
            c.pod_ports = ports.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect();
            c
        };
        let selected = [
            named("c1", "s1", &[("http", 8080), ("http-debug", 7070)]),
            named("c2", "s2", &[("http", 8080)]),
        ];
        let ips = HashMap::from([
            ("s1".to_owned(), "10.1.2.3".parse().expect("ip")),
            ("s2".to_owned(), "10.1.2.4".parse().expect("ip")),
        ]);
        let (endpoints, missing) = pod_endpoints(&selected, &ips);
        assert!(missing.is_empty());
        assert_eq!(endpoints.len(), 2);
        assert_eq!(endpoints[0].id, "s1:http-debug/debug/pprof");
        assert_eq!(endpoints[0].missing_port, None);
        assert_eq!(
            endpoints[0].urls[0].1,
            "http://10.1.2.3:7070/debug/pprof/heap"
        );
        assert_eq!(endpoints[1].missing_port.as_deref(), Some("http-debug"));
        assert!(endpoints[1].urls.iter().all(|(_, url)| url.is_empty()));
        assert_eq!(
            endpoints[1].urls.len(),
            2,
            "each profile still counts its error"
        );
    }
}

//! Issue 52: `pprof.port` by number or by container port name. The operator relays a name as
//! it is (each node's agent resolves it against the pod's own ports) and refuses what no pod
//! could serve.

use kiln_operator::resources::StoreNames;
use kiln_operator::resources::targets::aggregate;
use kiln_targets::PprofPort;
use serde_json::json;

use super::{profile_store, target};

fn relayed(port: serde_json::Value) -> Result<PprofPort, String> {
    let object = profile_store(json!({}));
    let names = StoreNames::of(&object).expect("store has metadata");
    let scraped = target(
        "shop",
        "go",
        json!({"storeRef": {"name": "main", "namespace": "kiln"}, "pprof": {"port": port}}),
    );
    let aggregation = aggregate(&names, &[scraped]);
    match (
        aggregation.file.targets.first(),
        aggregation.rejected.first(),
    ) {
        (Some(target), None) => Ok(target.pprof_scrape.clone().expect("pprof relayed").port),
        (None, Some(rejected)) => Err(rejected.problem.clone()),
        other => panic!("one target in, {other:?}"),
    }
}

#[test]
fn a_port_name_is_relayed_as_a_name_and_a_number_as_a_number() {
    assert_eq!(
        relayed(json!("http-debug")),
        Ok(PprofPort::Name("http-debug".to_owned()))
    );
    assert_eq!(relayed(json!(6060)), Ok(PprofPort::Number(6060)));
}

/// What the CRD's schema refuses is refused again here, so a target that reached the API
/// server some other way (an older CRD) never puts a bad port into the agents' file.
#[test]
fn ports_no_pod_could_serve_are_rejected_not_published() {
    for bad in [
        json!(0),
        json!(70000),
        json!(-1),
        json!("Debug_Port"),
        json!("6060"),
        json!("abcdefghijklmnop"),
    ] {
        let problem = relayed(bad.clone()).expect_err("rejected");
        assert!(problem.contains("port"), "{bad}: {problem}");
    }
}

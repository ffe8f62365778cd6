//! Fuzzes the control plane's filter-rule validation with arbitrary bytes
//! decoded as a protobuf `dpu.v1.ReplaceRulesRequest`, the message a
//! client sends to replace a tenant's rule set.
//!
//! Every rule goes through `validate::rule` (Ok or an error, never a
//! panic), and the request through what `FilterService.ReplaceRules`
//! does with it: the parent and rule names are checked, then
//! `State::replace_rules` against a state holding the tenant. When the
//! request is accepted, the stored rule set must be sorted by unique
//! priorities with unique, valid IDs, and each stored rule must come back
//! unchanged through the API form (`convert::rule`, then validation
//! again). Run with `fuzz/run.sh rule_proto` from the repository root.

use dpu_control::model::{Action, RuleSet, State, Tenant, Timestamp};
use dpu_control::state::Limits;
use dpu_control::{convert, validate};
use dpu_proto::v1 as pb;
use prost::Message;

/// The tenant the state holds.
const TENANT: &str = "fuzz";

/// `FilterService.ReplaceRules` without the store: validation, then the
/// state change. `None` if the request is refused.
fn replace_rules(state: &mut State, req: &pb::ReplaceRulesRequest) -> Option<u64> {
    let (tid, rules) = validate::replace_rules(req).ok()?;
    state
        .replace_rules(Limits::with_ram(0), &tid, rules, req.expected_version)
        .ok()
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Ok(mut req) = pb::ReplaceRulesRequest::decode(data) else {
        return;
    };
    // Each rule on its own, named or not, valid or not.
    for (i, r) in req.rules.iter().enumerate() {
        let _ = validate::rule(&format!("rules[{i}]"), "r", r);
        let _ = validate::rule_name("name", &r.name);
    }
    // Most fuzzed parents name no tenant; aim at the one there is now and
    // then, so the state checks run.
    if req.parent.len() == 1 {
        req.parent = format!("tenants/{TENANT}");
    }
    let mut state = State::default();
    state.tenants.insert(
        TENANT.to_string(),
        Tenant {
            id: TENANT.to_string(),
            display_name: String::new(),
            attachments: Vec::new(),
            default_policy: Action::Deny,
            create_time: Timestamp::default(),
            rules: RuleSet::default(),
            storage_qos: Default::default(),
            vlan_id: 0,
            no_offload: false,
        },
    );
    let before = state.clone();
    let Some(version) = replace_rules(&mut state, &req) else {
        assert_eq!(state, before, "a refused request changed the state");
        return;
    };
    let t = state.tenant(TENANT).expect("the tenant stays");
    assert_eq!(version, t.rules.version);
    assert_eq!(version, 1);
    assert_eq!(t.rules.rules.len(), req.rules.len());
    for w in t.rules.rules.windows(2) {
        assert!(
            w[0].priority < w[1].priority,
            "priorities not unique and sorted"
        );
    }
    let mut ids: Vec<&str> = t.rules.rules.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), t.rules.rules.len(), "rule IDs not unique");
    for r in t.rules.rules.iter() {
        validate::id("id", &r.id).expect("stored rule IDs are valid");
        let api = convert::rule(TENANT, r);
        let (owner, rid) = validate::rule_name("name", &api.name).expect("the API name parses");
        assert_eq!((owner, rid), (TENANT, r.id.as_str()));
        let again = validate::rule("rule", &r.id, &api).expect("a stored rule validates again");
        assert_eq!(&again, r, "the API form of a stored rule changes it");
        // And through the wire.
        let wire = pb::FilterRule::decode(api.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(wire, api);
    }
}

//! [`Claims`]: an index of attachments by the traffic they claim, so that
//! checking `n` new attachments against `m` held ones costs
//! `O((n + m) log m)` instead of the `O(n·m)` of comparing every pair with
//! [`Attachment::conflicts_with`].

use std::collections::{BTreeMap, HashMap};

use super::Attachment;

/// What the attachments on one port claim.
#[derive(Debug)]
struct PortClaims<'a, T> {
    /// The whole-port attachment, which overlaps everything on the port.
    whole: Option<(&'a Attachment, T)>,
    /// Any attachment on the port, which a new whole-port one overlaps.
    any: Option<(&'a Attachment, T)>,
    /// VLAN attachments by VLAN ID.
    vlans: HashMap<u16, (&'a Attachment, T)>,
    /// VXLAN attachments by VNI.
    vnis: HashMap<u32, (&'a Attachment, T)>,
}

impl<T> Default for PortClaims<'_, T> {
    fn default() -> Self {
        PortClaims {
            whole: None,
            any: None,
            vlans: HashMap::new(),
            vnis: HashMap::new(),
        }
    }
}

/// Attachments indexed by port and by what they claim there, each with a
/// tag `T` saying whose it is (a tenant ID, a list index).
///
/// [`Claims::find`] answers an attachment that
/// [`Attachment::conflicts_with`] the one asked about, if any is held:
/// the index keys on the same facts that method compares (port; whole
/// port, VLAN ID or VNI), and a test checks the two agree on every pair.
#[derive(Debug)]
pub struct Claims<'a, T> {
    ports: BTreeMap<&'a str, PortClaims<'a, T>>,
}

impl<T> Default for Claims<'_, T> {
    fn default() -> Self {
        Claims {
            ports: BTreeMap::new(),
        }
    }
}

impl<'a, T: Copy> Claims<'a, T> {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The held attachment that overlaps `a`, with its tag.
    pub fn find(&self, a: &Attachment) -> Option<(&'a Attachment, T)> {
        let p = self.ports.get(a.port())?;
        if let Some(w) = p.whole {
            return Some(w);
        }
        match a {
            Attachment::Port { vlan: 0, .. } => p.any,
            Attachment::Port { vlan, .. } => p.vlans.get(vlan).copied(),
            Attachment::Vxlan { vni, .. } => p.vnis.get(vni).copied(),
        }
    }

    /// Adds `a` with tag `tag`, unless it overlaps a held attachment: then
    /// nothing is added and that attachment is answered.
    pub fn insert(&mut self, a: &'a Attachment, tag: T) -> Result<(), (&'a Attachment, T)> {
        if let Some(held) = self.find(a) {
            return Err(held);
        }
        let p = self.ports.entry(a.port()).or_default();
        p.any.get_or_insert((a, tag));
        match a {
            Attachment::Port { vlan: 0, .. } => p.whole = Some((a, tag)),
            Attachment::Port { vlan, .. } => {
                p.vlans.insert(*vlan, (a, tag));
            }
            Attachment::Vxlan { vni, .. } => {
                p.vnis.insert(*vni, (a, tag));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Attachment> {
        let mut out = vec![];
        for port in ["p0", "p1"] {
            for vlan in [0, 1, 10, 4094] {
                out.push(Attachment::port_vlan(port, vlan));
            }
            for vni in [1, 10, 0x00FF_FFFF] {
                out.push(Attachment::Vxlan {
                    uplink: port.into(),
                    vni,
                    remote_vteps: vec![],
                    underlay_prefixes: vec![],
                });
            }
        }
        out
    }

    /// Every ordered pair, and every sequence of inserts of a small set,
    /// agrees with `conflicts_with`.
    #[test]
    fn agrees_with_conflicts_with() {
        let atts = all();
        for a in &atts {
            for b in &atts {
                let mut c = Claims::new();
                c.insert(a, ()).unwrap();
                assert_eq!(c.find(b).is_some(), a.conflicts_with(b), "{a} vs {b}");
            }
        }
        // Inserting in every rotation: each accepted one overlaps none
        // held, each refused one overlaps the one answered.
        for start in 0..atts.len() {
            let mut c = Claims::new();
            let mut held: Vec<&Attachment> = vec![];
            for a in atts.iter().cycle().skip(start).take(atts.len()) {
                match c.insert(a, ()) {
                    Ok(()) => {
                        assert!(held.iter().all(|h| !h.conflicts_with(a)), "{a}");
                        held.push(a);
                    }
                    Err((o, ())) => {
                        assert!(o.conflicts_with(a), "{a} refused for {o}");
                        assert!(held.iter().any(|h| std::ptr::eq(*h, o)));
                    }
                }
            }
        }
    }
}

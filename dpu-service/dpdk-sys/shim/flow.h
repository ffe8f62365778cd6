/*
 * dpdk-sys flow builder: one flow rule described in a plain struct whose
 * layout is the same for every DPDK release we build against, turned into
 * rte_flow items and actions here, where the release's own headers decide
 * the layout of each item (the Ethernet, VLAN, IPv6 and VXLAN items moved
 * fields between 22.11 and 24.11). Rust fills the struct; C builds the
 * arrays on its stack and calls rte_flow_validate / rte_flow_create.
 */
#ifndef DPDK_SYS_FLOW_H
#define DPDK_SYS_FLOW_H

#include <stdint.h>

struct rte_flow;
struct rte_flow_error;

/* Match flags. */
#define DPDK_SHIM_FLOW_TRANSFER (1u << 0)  /* transfer rule, pattern starts with the represented port in_port */
#define DPDK_SHIM_FLOW_INGRESS (1u << 1)   /* ingress rule on the port it is created on */
#define DPDK_SHIM_FLOW_IPV6 (1u << 2)      /* the addresses are IPv6 (else IPv4 in the first 4 bytes) */
#define DPDK_SHIM_FLOW_VLAN (1u << 3)      /* an outer 802.1Q tag with vlan_id */
#define DPDK_SHIM_FLOW_NO_VLAN (1u << 4)   /* no tag at all (the Ethernet item's has_vlan bit) */
#define DPDK_SHIM_FLOW_VXLAN (1u << 5)     /* arrives in VXLAN (IPv4, UDP 4789) with vni; MACs and L3/L4 are the inner frame's */
#define DPDK_SHIM_FLOW_MACS (1u << 6)      /* match src_mac and dst_mac */
#define DPDK_SHIM_FLOW_TCP_FLAGS (1u << 7) /* the TCP flags in tcp_flags_clear are all clear */
/* Action flags, applied in this order before the fate. */
#define DPDK_SHIM_FLOW_DECAP (1u << 8)     /* remove the VXLAN outer headers */
#define DPDK_SHIM_FLOW_POP_VLAN (1u << 9)  /* remove the outer tag */
#define DPDK_SHIM_FLOW_PUSH_VLAN (1u << 10) /* add a tag with set_vid */
#define DPDK_SHIM_FLOW_SET_VLAN (1u << 11) /* change the outer tag's VLAN ID to set_vid */
#define DPDK_SHIM_FLOW_ENCAP (1u << 12)    /* put the frame in VXLAN with the encap_* headers */
#define DPDK_SHIM_FLOW_COUNT (1u << 13)    /* a packet and byte counter */
#define DPDK_SHIM_FLOW_AGE (1u << 14)      /* an idle age of age_secs, reported with age_context */

/* What happens to a matched packet in the end. */
#define DPDK_SHIM_FLOW_FATE_DROP 0
#define DPDK_SHIM_FLOW_FATE_PORT 1 /* out of the represented port out_port */

struct dpdk_shim_flow {
	uint32_t flags;
	uint32_t priority;
	uint32_t group;
	uint16_t in_port;
	uint16_t vlan_id;
	uint32_t vni;
	uint8_t src_mac[6];
	uint8_t dst_mac[6];
	uint8_t src_ip[16]; /* network byte order */
	uint8_t dst_ip[16];
	uint16_t src_port; /* host byte order; ICMP: type */
	uint16_t dst_port; /* ICMP: code */
	uint8_t proto;     /* IP protocol: TCP and UDP match ports, ICMP and ICMPv6 type and code */
	uint8_t tcp_flags_clear;
	uint8_t fate;
	uint8_t reserved;
	uint16_t out_port;
	uint16_t set_vid;
	uint8_t encap_src_mac[6];
	uint8_t encap_dst_mac[6];
	uint32_t encap_src_ip; /* host byte order */
	uint32_t encap_dst_ip;
	uint16_t encap_src_port; /* host byte order; the outer UDP source port */
	uint16_t reserved2;
	uint32_t encap_vni;
	uint32_t age_secs;
	uint64_t age_context;
};

/* rte_flow_validate of the rule; 0 or a negative errno, with *error set. */
int dpdk_shim_flow_validate(uint16_t port_id, const struct dpdk_shim_flow *flow, struct rte_flow_error *error);
/* rte_flow_create of the rule; NULL with *error set on failure. */
struct rte_flow *dpdk_shim_flow_create(uint16_t port_id, const struct dpdk_shim_flow *flow, struct rte_flow_error *error);
/* rte_flow_query of the rule's COUNT action into *hits and *bytes; 0 or a negative errno. */
int dpdk_shim_flow_query_count(uint16_t port_id, struct rte_flow *flow, uint64_t *hits, uint64_t *bytes, struct rte_flow_error *error);
/* rte_flow_get_aged_flows: up to n contexts of aged rules into out; their number or a negative errno. */
int dpdk_shim_flow_aged(uint16_t port_id, uint64_t *out, uint32_t n, struct rte_flow_error *error);
/* rte_flow_pick_transfer_proxy: the port transfer rules for port_id are created on. */
int dpdk_shim_flow_transfer_proxy(uint16_t port_id, uint16_t *proxy, struct rte_flow_error *error);

#endif

/* The flow builder; see flow.h. */
#define ALLOW_EXPERIMENTAL_API 1
#include "flow.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>

#include <rte_byteorder.h>
#include <rte_flow.h>

#define VXLAN_PORT 4789
#define MAX_ITEMS 12
#define MAX_ACTIONS 10
#define MAX_AGED 256

/* Everything one rule points at, on the caller's stack. */
struct built {
	struct rte_flow_attr attr;
	struct rte_flow_item items[MAX_ITEMS];
	struct rte_flow_action actions[MAX_ACTIONS];
	struct rte_flow_item_ethdev in_port;
	struct rte_flow_item_eth outer_eth, outer_eth_mask;
	struct rte_flow_item_ipv4 outer_ip, outer_ip_mask;
	struct rte_flow_item_udp outer_udp, outer_udp_mask;
	struct rte_flow_item_vxlan vxlan, vxlan_mask;
	struct rte_flow_item_eth eth, eth_mask;
	struct rte_flow_item_vlan vlan, vlan_mask;
	struct rte_flow_item_ipv4 ip4, ip4_mask;
	struct rte_flow_item_ipv6 ip6, ip6_mask;
	struct rte_flow_item_tcp tcp, tcp_mask;
	struct rte_flow_item_udp udp, udp_mask;
	struct rte_flow_item_icmp icmp, icmp_mask;
	struct rte_flow_item_icmp6 icmp6, icmp6_mask;
	struct rte_flow_action_of_push_vlan push;
	struct rte_flow_action_of_set_vlan_vid vid;
	struct rte_flow_action_vxlan_encap encap;
	struct rte_flow_item encap_items[5];
	struct rte_flow_item_eth encap_eth;
	struct rte_flow_item_ipv4 encap_ip;
	struct rte_flow_item_udp encap_udp;
	struct rte_flow_item_vxlan encap_vxlan;
	struct rte_flow_action_count count;
	struct rte_flow_action_age age;
	struct rte_flow_action_ethdev out_port;
	int n_items;
	int n_actions;
};

static void item(struct built *b, enum rte_flow_item_type type, const void *spec, const void *mask)
{
	struct rte_flow_item *it = &b->items[b->n_items++];

	it->type = type;
	it->spec = spec;
	it->mask = mask;
	it->last = NULL;
}

static void action(struct built *b, enum rte_flow_action_type type, const void *conf)
{
	struct rte_flow_action *a = &b->actions[b->n_actions++];

	a->type = type;
	a->conf = conf;
}

/* The inner (or only) Ethernet header, tag, IP and L4 items. */
static int build_l2_to_l4(struct built *b, const struct dpdk_shim_flow *f)
{
	if (f->flags & DPDK_SHIM_FLOW_MACS) {
		memcpy(b->eth.hdr.dst_addr.addr_bytes, f->dst_mac, 6);
		memcpy(b->eth.hdr.src_addr.addr_bytes, f->src_mac, 6);
		memset(b->eth_mask.hdr.dst_addr.addr_bytes, 0xff, 6);
		memset(b->eth_mask.hdr.src_addr.addr_bytes, 0xff, 6);
	}
	if (f->flags & DPDK_SHIM_FLOW_NO_VLAN) {
		b->eth.has_vlan = 0;
		b->eth_mask.has_vlan = 1;
	}
	item(b, RTE_FLOW_ITEM_TYPE_ETH, &b->eth, &b->eth_mask);
	if (f->flags & DPDK_SHIM_FLOW_VLAN) {
		b->vlan.hdr.vlan_tci = rte_cpu_to_be_16(f->vlan_id & 0x0fff);
		b->vlan_mask.hdr.vlan_tci = rte_cpu_to_be_16(0x0fff);
		item(b, RTE_FLOW_ITEM_TYPE_VLAN, &b->vlan, &b->vlan_mask);
	}
	if (f->flags & DPDK_SHIM_FLOW_IPV6) {
		memcpy(&b->ip6.hdr.src_addr, f->src_ip, 16);
		memcpy(&b->ip6.hdr.dst_addr, f->dst_ip, 16);
		memset(&b->ip6_mask.hdr.src_addr, 0xff, 16);
		memset(&b->ip6_mask.hdr.dst_addr, 0xff, 16);
		b->ip6.hdr.proto = f->proto;
		b->ip6_mask.hdr.proto = 0xff;
		item(b, RTE_FLOW_ITEM_TYPE_IPV6, &b->ip6, &b->ip6_mask);
	} else {
		memcpy(&b->ip4.hdr.src_addr, f->src_ip, 4);
		memcpy(&b->ip4.hdr.dst_addr, f->dst_ip, 4);
		b->ip4_mask.hdr.src_addr = UINT32_MAX;
		b->ip4_mask.hdr.dst_addr = UINT32_MAX;
		b->ip4.hdr.next_proto_id = f->proto;
		b->ip4_mask.hdr.next_proto_id = 0xff;
		item(b, RTE_FLOW_ITEM_TYPE_IPV4, &b->ip4, &b->ip4_mask);
	}
	switch (f->proto) {
	case IPPROTO_TCP:
		b->tcp.hdr.src_port = rte_cpu_to_be_16(f->src_port);
		b->tcp.hdr.dst_port = rte_cpu_to_be_16(f->dst_port);
		b->tcp_mask.hdr.src_port = UINT16_MAX;
		b->tcp_mask.hdr.dst_port = UINT16_MAX;
		if (f->flags & DPDK_SHIM_FLOW_TCP_FLAGS)
			b->tcp_mask.hdr.tcp_flags = f->tcp_flags_clear;
		item(b, RTE_FLOW_ITEM_TYPE_TCP, &b->tcp, &b->tcp_mask);
		break;
	case IPPROTO_UDP:
		b->udp.hdr.src_port = rte_cpu_to_be_16(f->src_port);
		b->udp.hdr.dst_port = rte_cpu_to_be_16(f->dst_port);
		b->udp_mask.hdr.src_port = UINT16_MAX;
		b->udp_mask.hdr.dst_port = UINT16_MAX;
		item(b, RTE_FLOW_ITEM_TYPE_UDP, &b->udp, &b->udp_mask);
		break;
	case IPPROTO_ICMP:
		if (f->flags & DPDK_SHIM_FLOW_IPV6)
			return -EINVAL;
		b->icmp.hdr.icmp_type = (uint8_t)f->src_port;
		b->icmp.hdr.icmp_code = (uint8_t)f->dst_port;
		b->icmp_mask.hdr.icmp_type = 0xff;
		b->icmp_mask.hdr.icmp_code = 0xff;
		item(b, RTE_FLOW_ITEM_TYPE_ICMP, &b->icmp, &b->icmp_mask);
		break;
	case IPPROTO_ICMPV6:
		if (!(f->flags & DPDK_SHIM_FLOW_IPV6))
			return -EINVAL;
		b->icmp6.type = (uint8_t)f->src_port;
		b->icmp6.code = (uint8_t)f->dst_port;
		b->icmp6_mask.type = 0xff;
		b->icmp6_mask.code = 0xff;
		item(b, RTE_FLOW_ITEM_TYPE_ICMP6, &b->icmp6, &b->icmp6_mask);
		break;
	default:
		/* The protocol alone, matched by the IP item. */
		break;
	}
	return 0;
}

static void build_encap(struct built *b, const struct dpdk_shim_flow *f)
{
	memcpy(b->encap_eth.hdr.dst_addr.addr_bytes, f->encap_dst_mac, 6);
	memcpy(b->encap_eth.hdr.src_addr.addr_bytes, f->encap_src_mac, 6);
	b->encap_eth.hdr.ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	b->encap_ip.hdr.version_ihl = RTE_IPV4_VHL_DEF;
	b->encap_ip.hdr.time_to_live = 64;
	b->encap_ip.hdr.next_proto_id = IPPROTO_UDP;
	b->encap_ip.hdr.src_addr = rte_cpu_to_be_32(f->encap_src_ip);
	b->encap_ip.hdr.dst_addr = rte_cpu_to_be_32(f->encap_dst_ip);
	b->encap_udp.hdr.src_port = rte_cpu_to_be_16(f->encap_src_port);
	b->encap_udp.hdr.dst_port = rte_cpu_to_be_16(VXLAN_PORT);
	b->encap_vxlan.hdr.vx_flags = rte_cpu_to_be_32(0x08000000);
	b->encap_vxlan.hdr.vx_vni = rte_cpu_to_be_32((f->encap_vni & 0xffffff) << 8);
	b->encap_items[0] = (struct rte_flow_item){ .type = RTE_FLOW_ITEM_TYPE_ETH, .spec = &b->encap_eth };
	b->encap_items[1] = (struct rte_flow_item){ .type = RTE_FLOW_ITEM_TYPE_IPV4, .spec = &b->encap_ip };
	b->encap_items[2] = (struct rte_flow_item){ .type = RTE_FLOW_ITEM_TYPE_UDP, .spec = &b->encap_udp };
	b->encap_items[3] = (struct rte_flow_item){ .type = RTE_FLOW_ITEM_TYPE_VXLAN, .spec = &b->encap_vxlan };
	b->encap_items[4] = (struct rte_flow_item){ .type = RTE_FLOW_ITEM_TYPE_END };
	b->encap.definition = b->encap_items;
	action(b, RTE_FLOW_ACTION_TYPE_VXLAN_ENCAP, &b->encap);
}

static int build(struct built *b, const struct dpdk_shim_flow *f)
{
	int ret;

	memset(b, 0, sizeof(*b));
	b->attr.group = f->group;
	b->attr.priority = f->priority;
	b->attr.transfer = !!(f->flags & DPDK_SHIM_FLOW_TRANSFER);
	b->attr.ingress = !!(f->flags & DPDK_SHIM_FLOW_INGRESS);

	if (f->flags & DPDK_SHIM_FLOW_TRANSFER) {
		b->in_port.port_id = f->in_port;
		item(b, RTE_FLOW_ITEM_TYPE_REPRESENTED_PORT, &b->in_port, NULL);
	}
	if (f->flags & DPDK_SHIM_FLOW_VXLAN) {
		item(b, RTE_FLOW_ITEM_TYPE_ETH, &b->outer_eth, &b->outer_eth_mask);
		b->outer_ip.hdr.next_proto_id = IPPROTO_UDP;
		b->outer_ip_mask.hdr.next_proto_id = 0xff;
		item(b, RTE_FLOW_ITEM_TYPE_IPV4, &b->outer_ip, &b->outer_ip_mask);
		b->outer_udp.hdr.dst_port = rte_cpu_to_be_16(VXLAN_PORT);
		b->outer_udp_mask.hdr.dst_port = UINT16_MAX;
		item(b, RTE_FLOW_ITEM_TYPE_UDP, &b->outer_udp, &b->outer_udp_mask);
		b->vxlan.hdr.vx_vni = rte_cpu_to_be_32((f->vni & 0xffffff) << 8);
		b->vxlan_mask.hdr.vx_vni = rte_cpu_to_be_32(0xffffff00);
		item(b, RTE_FLOW_ITEM_TYPE_VXLAN, &b->vxlan, &b->vxlan_mask);
	}
	ret = build_l2_to_l4(b, f);
	if (ret)
		return ret;
	item(b, RTE_FLOW_ITEM_TYPE_END, NULL, NULL);

	if (f->flags & DPDK_SHIM_FLOW_DECAP)
		action(b, RTE_FLOW_ACTION_TYPE_VXLAN_DECAP, NULL);
	if (f->flags & DPDK_SHIM_FLOW_POP_VLAN)
		action(b, RTE_FLOW_ACTION_TYPE_OF_POP_VLAN, NULL);
	if (f->flags & DPDK_SHIM_FLOW_PUSH_VLAN) {
		b->push.ethertype = rte_cpu_to_be_16(RTE_ETHER_TYPE_VLAN);
		action(b, RTE_FLOW_ACTION_TYPE_OF_PUSH_VLAN, &b->push);
	}
	if (f->flags & (DPDK_SHIM_FLOW_PUSH_VLAN | DPDK_SHIM_FLOW_SET_VLAN)) {
		b->vid.vlan_vid = rte_cpu_to_be_16(f->set_vid & 0x0fff);
		action(b, RTE_FLOW_ACTION_TYPE_OF_SET_VLAN_VID, &b->vid);
	}
	if (f->flags & DPDK_SHIM_FLOW_ENCAP)
		build_encap(b, f);
	if (f->flags & DPDK_SHIM_FLOW_COUNT)
		action(b, RTE_FLOW_ACTION_TYPE_COUNT, &b->count);
	if (f->flags & DPDK_SHIM_FLOW_AGE) {
		b->age.timeout = f->age_secs & 0xffffff;
		b->age.context = (void *)(uintptr_t)f->age_context;
		action(b, RTE_FLOW_ACTION_TYPE_AGE, &b->age);
	}
	switch (f->fate) {
	case DPDK_SHIM_FLOW_FATE_DROP:
		action(b, RTE_FLOW_ACTION_TYPE_DROP, NULL);
		break;
	case DPDK_SHIM_FLOW_FATE_PORT:
		b->out_port.port_id = f->out_port;
		action(b, RTE_FLOW_ACTION_TYPE_REPRESENTED_PORT, &b->out_port);
		break;
	default:
		return -EINVAL;
	}
	action(b, RTE_FLOW_ACTION_TYPE_END, NULL);
	return 0;
}

static int invalid(struct rte_flow_error *error, int ret)
{
	return rte_flow_error_set(error, -ret, RTE_FLOW_ERROR_TYPE_UNSPECIFIED, NULL,
				  "the rule description is inconsistent (ICMP type with the other IP version, or an unknown fate)");
}

int dpdk_shim_flow_validate(uint16_t port_id, const struct dpdk_shim_flow *f, struct rte_flow_error *error)
{
	struct built b;
	int ret = build(&b, f);

	if (ret)
		return invalid(error, ret);
	return rte_flow_validate(port_id, &b.attr, b.items, b.actions, error);
}

struct rte_flow *dpdk_shim_flow_create(uint16_t port_id, const struct dpdk_shim_flow *f, struct rte_flow_error *error)
{
	struct built b;
	int ret = build(&b, f);

	if (ret) {
		invalid(error, ret);
		return NULL;
	}
	return rte_flow_create(port_id, &b.attr, b.items, b.actions, error);
}

int dpdk_shim_flow_query_count(uint16_t port_id, struct rte_flow *flow, uint64_t *hits, uint64_t *bytes, struct rte_flow_error *error)
{
	struct rte_flow_query_count q;
	const struct rte_flow_action count[] = {
		{ .type = RTE_FLOW_ACTION_TYPE_COUNT },
		{ .type = RTE_FLOW_ACTION_TYPE_END },
	};
	int ret;

	memset(&q, 0, sizeof(q));
	ret = rte_flow_query(port_id, flow, count, &q, error);
	if (ret)
		return ret;
	*hits = q.hits_set ? q.hits : 0;
	*bytes = q.bytes_set ? q.bytes : 0;
	return 0;
}

int dpdk_shim_flow_aged(uint16_t port_id, uint64_t *out, uint32_t n, struct rte_flow_error *error)
{
	void *contexts[MAX_AGED];
	int got, i;

	if (n > MAX_AGED)
		n = MAX_AGED;
	got = rte_flow_get_aged_flows(port_id, contexts, n, error);
	for (i = 0; i < got; i++)
		out[i] = (uint64_t)(uintptr_t)contexts[i];
	return got;
}

int dpdk_shim_flow_transfer_proxy(uint16_t port_id, uint16_t *proxy, struct rte_flow_error *error)
{
	return rte_flow_pick_transfer_proxy(port_id, proxy, error);
}

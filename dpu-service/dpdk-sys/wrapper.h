/* Headers bindgen reads; only allow-listed items are bound (see build.rs). */
#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_flow.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_version.h>
#include "shim/shim.h"
#include "shim/flow.h"

/* prefill-node: a prefill node of a pdserve cluster (see common/prefill_node.h). */
#include "node_main.h"

int main(int argc, char **argv)
{
    return node_main(argc, argv, CLUSTER_ROLE_PREFILL);
}

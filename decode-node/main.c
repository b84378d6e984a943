/* decode-node: a decode node of a pdserve cluster (see common/decode_node.h). */
#include "node_main.h"

int main(int argc, char **argv)
{
    return node_main(argc, argv, CLUSTER_ROLE_DECODE);
}

# rdma-core's own rdma_cm tests (tests/test_rdmacm.py, unmodified) on a device whose address is
# given. The suite finds a device's address from /sys/class/infiniband/DEV/device/net/, a link
# to the PCI function's netdevs that a virtual device (kernel rxe, softroce) does not have, so
# on rxe it skips every one of them; this runner gives the address instead
# (SOFTROCE_SUITE_ADDR) and is otherwise the suite's run_tests.py. Run it from the unpacked
# suite's parent directory: python3 rdma_core_rdmacm.py -v --dev DEV --gid N test_rdmacm
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from args_parser import parser  # noqa: E402

tests = SourceFileLoader("tests", os.path.join("tests", "__init__.py")).load_module()
from tests.base import RDMATestCase  # noqa: E402

ADDR = os.environ["SOFTROCE_SUITE_ADDR"]


def given_address(self, dev, port, idx):
    self.args.append([dev, port, idx, ADDR, None])


RDMATestCase._get_ip_mac = given_address
parser.parse_args()
unittest.main(module=tests)

// The program of the layer link check (CMakeLists.txt, lns_link_<layer>): it runs
// nothing; linking it with one layer library whole is the check.
int main() { return 0; }

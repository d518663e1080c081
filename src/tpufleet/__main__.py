from tpufleet.cli import main

main()

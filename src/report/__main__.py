from longctx.report.cli import main

main()

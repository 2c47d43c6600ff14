from jaxswe.cli import main

main()

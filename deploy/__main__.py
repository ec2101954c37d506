from .host import main

main()

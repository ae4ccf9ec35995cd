// Command dynk8s-node is the node agent. This is a placeholder until the agent's own program lands (issue 27).
package main

import "fmt"

func main() { fmt.Println("dynk8s-node placeholder") }

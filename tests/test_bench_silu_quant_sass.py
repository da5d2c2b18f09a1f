"""bench/silu_quant_sass.py's reading of where a compiled tile loop issues its loads."""

from bench_scripts import load_bench

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                /* 0x00000a0000017a02 */
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;          /* 0x0000000404027981 */
        /*0020*/                   IMAD R3, R2, R2, RZ ;                 /* 0x0000000202037224 */
        /*0030*/                   MUFU.EX2 R3, R3 ;                     /* 0x0000000303037308 */
        /*0040*/                   LDG.E.128 R4, desc[UR4][R6.64] ;      /* 0x0000000406047981 */
        /*0050*/               @P0 BRA 0x70 ;                            /* 0x0000000000040947 */
        /*0060*/                   BRA 0x20 ;                            /* 0xfffffffc00fc7947 */
        /*0070*/                   EXIT ;                                /* 0x000000000000794d */
"""


def test_the_loop_is_the_backward_branch_and_its_loads_are_counted_from_its_top():
    got = load_bench("silu_quant_sass").tile_loop_loads(SASS)
    assert got == {"loop_instructions": 5, "loads_in_loop": 1, "first_load_after": 2, "last_load_after": 2,
                   "mufu_before_first_load": 1, "mufu_in_loop": 1}


EXIT = "        /*0070*/                   EXIT ;                                /* 0x000000000000794d */\n"
TWO_LOOPS = SASS.replace(EXIT, """\
        /*0070*/                   HSET2 R1, R2, R3 ;                    /* 0x0000000000000000 */
        /*0080*/                   LDG.E.64 R8, desc[UR4][R6.64] ;       /* 0x0000000000000000 */
        /*0090*/               @P1 BRA 0x70 ;                            /* 0x0000000000000000 */
        /*00a0*/                   EXIT ;                                /* 0x000000000000794d */
""")


def test_a_loop_can_be_picked_by_an_opcode_in_it():
    """The NVFP4 kernel has a loop per path: the widest is the fallback's, the bf16 path's has the compares."""
    sass = load_bench("silu_quant_sass")
    assert sass.tile_loop_loads(TWO_LOOPS)["loop_instructions"] == 5
    got = sass.tile_loop_loads(TWO_LOOPS, "HSET2")
    assert (got["loop_instructions"], got["first_load_after"], got["mufu_in_loop"]) == (3, 1, 0)

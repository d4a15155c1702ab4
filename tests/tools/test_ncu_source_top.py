"""tools/ncu_source_top.py: the per-instruction stall summary of an ncu source-page CSV, on a small CSV in ncu's
shape (banner lines, quoted numbers with thousands separators, predicated SASS)."""

import pytest

CSV = '''==PROF== Connected to process 1234
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed"
"0x100","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24","1,000","900","64"
"0x110","@P0 LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64]","250","200","64"
"0x120","WARPGROUP.DEPBAR.LE gsb0, 0x1","2,500","2,400","64"
"0x130","HMUL2 R60, R61, R62","250","50","1024"
"0x140","HMUL2 R63, R64, R65","0","0","1024"
'''


@pytest.fixture(scope="module")
def top():
    from tools import ncu_source_top
    return ncu_source_top


def test_rows_shares_and_opcodes(top, tmp_path):
    path = tmp_path / "k.csv"
    path.write_text(CSV)
    rows = top.read_source_csv(path)
    assert [r[2] for r in rows] == [1000.0, 250.0, 2500.0, 250.0, 0.0]
    assert rows[2][3] == 2400.0 and rows[1][0] == "0x110"
    assert [top.sass_opcode(r[1]) for r in rows] == ["HGMMA", "LDGSTS", "WARPGROUP", "HMUL2", "HMUL2"]
    lines = top.summarize(rows, top=2)
    assert lines[0] == "5 instructions, 4000 samples"
    assert "62.5%" in lines[1] and "DEPBAR" in lines[1]          # 2500 / 4000 first
    assert "25.0%" in lines[2] and "HGMMA" in lines[2]
    assert lines[-1].startswith("per opcode: WARPGROUP 62.5%, HGMMA 25.0%")
    assert "HMUL2 6.2%" in lines[-1] and "LDGSTS 6.2%" in lines[-1]


def test_a_csv_without_the_sampling_columns_is_named(top, tmp_path):
    path = tmp_path / "other.csv"
    path.write_text('"Kernel Name","Metric Name","Metric Value"\n"k","Duration","1"\n')
    with pytest.raises(SystemExit, match="other.csv"):
        top.read_source_csv(path)
